//! The `idempotent` command line against DynamoDB Local (`table create|check`, `key show|release`) and
//! by value (`capacity`).

use std::process::{Command, Output};

use idempotent_runtime::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idempotent_runtime::aws_sdk_dynamodb::{Client, Config};
use idempotent_runtime::{Idempotency, Status, Store as _};

const ENDPOINT_VAR: &str = "IDEMPOTENT_DYNAMODB_ENDPOINT";

fn endpoint() -> String {
    std::env::var(ENDPOINT_VAR).unwrap_or_else(|_| {
        panic!(
            "this test needs DynamoDB Local, and {ENDPOINT_VAR} is not set: run the tests with `scripts/test` \
             (it installs and starts DynamoDB Local), or start one with `scripts/dynamodb-local start` and \
             export {ENDPOINT_VAR}=<the printed endpoint>"
        )
    })
}

fn client() -> Client {
    Client::from_conf(
        Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(endpoint())
            .credentials_provider(Credentials::new("dummy", "dummy", None, None, "tests"))
            .build(),
    )
}

fn table_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// `idempotent args..`, pointed at DynamoDB Local.
fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idempotent"));
    command
        .args(args)
        .env(ENDPOINT_VAR, endpoint())
        .env("AWS_ACCESS_KEY_ID", "dummy")
        .env("AWS_SECRET_ACCESS_KEY", "dummy")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    command
}

/// Runs `idempotent args..` against DynamoDB Local.
fn idempotent(args: &[&str]) -> Output {
    command(args).output().expect("run the idempotent binary")
}

/// A fresh table, created by the command line, with a handle on it.
fn setup(prefix: &str) -> (String, idempotent_runtime::DynamoDbStore, Idempotency) {
    let table = table_name(prefix);
    run_text(&["table", "create", "--table", &table]);
    let store = idempotent_runtime::DynamoDbStore::new(client(), &table);
    let idem = Idempotency::builder(store.clone()).build();
    (table, store, idem)
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout(output)).unwrap()
}

/// Runs `idempotent args..`, which must succeed, and parses its `--json` output.
fn run_json(args: &[&str]) -> serde_json::Value {
    json(&idempotent(args))
}

/// Runs `idempotent args..`, which must succeed, and returns its text output.
fn run_text(args: &[&str]) -> String {
    stdout(&idempotent(args))
}

/// `key <verb> --table <table> [flags..] <namespace> <key>`: the arguments of a `key` command.
fn key_args<'a>(
    verb: &'a str,
    table: &'a str,
    flags: &[&'a str],
    namespace: &'a str,
    key: &'a str,
) -> Vec<&'a str> {
    [
        &["key", verb, "--table", table][..],
        flags,
        &[namespace, key],
    ]
    .concat()
}

/// `capacity` for 2000 requests a second, 15% duplicates and 200-byte responses.
const CAPACITY: [&str; 7] = [
    "capacity",
    "--peak-rps",
    "2000",
    "--duplicate-ratio",
    "0.15",
    "--response-bytes",
    "200",
];

#[tokio::test]
async fn table_create_and_check() {
    let table = table_name("cli-table");
    let created = run_json(&["table", "create", "--table", &table, "--json"]);
    assert_eq!(created["status"], "ACTIVE");
    assert_eq!(created["key_attribute"], "pk");
    assert_eq!(created["ttl_attribute"], "expires_at");
    let text = run_text(&["table", "check", "--table", &table]);
    assert!(text.contains("fits the store"), "{text}");
    assert!(text.contains("TTL           on `expires_at`"), "{text}");

    let missing = idempotent(&["table", "check", "--table", &table_name("cli-none")]);
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("does not exist"), "{err}");
}

#[tokio::test]
async fn key_show_decodes_a_completed_record() {
    let (table, _, idem) = setup("cli-show");
    let value: String = idem
        .operation("billing::charge", &(7, "order-1"))
        .run(|_| async { Ok::<_, idempotent_runtime::Error>("ch_7_order-1".to_owned()) })
        .await
        .unwrap();
    assert_eq!(value, "ch_7_order-1");
    let show = key_args("show", &table, &[], "billing::charge", r#"[7, "order-1"]"#);
    let shown = run_json(&[&show[..], &["--json"]].concat());
    assert_eq!(shown["status"], "COMPLETED");
    assert_eq!(shown["attempt"], 1);
    assert_eq!(shown["response_preview"], "\"ch_7_order-1\"");
    assert_eq!(
        shown["key"],
        idempotent_runtime::derive_key("billing::charge", &(7, "order-1")).unwrap()
    );
    let text = run_text(&show);
    assert!(text.contains("status     COMPLETED (attempt 1)"), "{text}");
    let missing = idempotent(&["key", "show", "--table", &table, "billing::charge", "[7]"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no record for"));
}

#[tokio::test]
async fn key_release_frees_a_stuck_claim_after_confirmation() {
    let (table, store, idem) = setup("cli-release");
    // A stuck claim: its worker died mid-body. Stopped only once the body runs: a call dropped before
    // its body started releases its claim.
    let (started, body_runs) = tokio::sync::oneshot::channel::<()>();
    let stuck = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.operation("billing::charge", &(7, "order-2"))
                .run(|_| async move {
                    let _ = started.send(());
                    std::future::pending::<Result<String, idempotent_runtime::Error>>().await
                })
                .await
        }
    });
    let key = idempotent_runtime::derive_key("billing::charge", &(7, "order-2")).unwrap();
    body_runs.await.unwrap();
    stuck.abort();
    let args = key_args(
        "release",
        &table,
        &[],
        "billing::charge",
        r#"[7, "order-2"]"#,
    );
    let show = key_args("show", &table, &[], "billing::charge", r#"[7, "order-2"]"#);
    let shown = run_json(&[&show[..], &["--json"]].concat());
    assert_eq!(shown["status"], "PENDING");
    assert!(shown["lease_left_ms"].as_i64().unwrap() > 50_000, "{shown}");

    // Without --yes, a "no" releases nothing.
    let mut child = command(&args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"n\n").unwrap();
    let refused = child.wait_with_output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not released"));
    assert_eq!(
        store.get(&key).await.unwrap().unwrap().status,
        Status::Pending
    );

    let released = run_json(&[&args[..], &["--yes", "--json"]].concat());
    assert_eq!(released["released"], true);
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Failed);
    assert!(record.error.unwrap().contains("released by an operator"));
    // The key runs again at once.
    let value: String = idem
        .operation("billing::charge", &(7, "order-2"))
        .run(|_| async { Ok::<_, idempotent_runtime::Error>("ch_7_order-2".to_owned()) })
        .await
        .unwrap();
    assert_eq!(value, "ch_7_order-2");

    // Releasing a completed key is refused, and says why.
    let again = idempotent(&[&args[..], &["--yes"]].concat());
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("COMPLETED, not PENDING"), "{err}");
}

/// A table of another layout: `--layout` creates its key schema, checks it, and finds and releases
/// keys by their full primary key; without it, the table is refused.
#[tokio::test]
async fn a_tenant_layout_table_is_created_checked_shown_and_released() {
    use idempotent_runtime::Layout;
    let table = table_name("cli-tenant");
    let created = run_json(&[
        "table", "create", "--table", &table, "--layout", "tenant", "--json",
    ]);
    assert_eq!(created["layout"], "tenant");
    assert_eq!(created["key_attribute"], "pk");
    assert_eq!(created["sort_key_attribute"], "sk");
    assert_eq!(created["replicas"], serde_json::json!([]));
    let text = run_text(&["table", "check", "--table", &table, "--layout", "tenant"]);
    assert!(text.contains("sort key      sk (S)"), "{text}");
    // The default layout does not fit the table, and says what would.
    let refused = idempotent(&["table", "check", "--table", &table]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("exactly one partition key `pk`"), "{err}");
    let bad = idempotent(&["table", "check", "--table", &table, "--layout", "pk"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown layout `pk`"));

    let store =
        idempotent_runtime::DynamoDbStore::new(client(), &table).with_layout(Layout::Tenant);
    let idem = Idempotency::builder(store.clone()).build();
    let stuck = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.operation("billing::charge", &(8, "order-3"))
                .run(|_| std::future::pending::<Result<String, idempotent_runtime::Error>>())
                .await
        }
    });
    let key = idempotent_runtime::derive_key("billing::charge", &(8, "order-3")).unwrap();
    while store.get(&key).await.unwrap().is_none() {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    stuck.abort();
    let tenant = ["--layout", "tenant"];
    let show = key_args(
        "show",
        &table,
        &tenant,
        "billing::charge",
        r#"[8, "order-3"]"#,
    );
    let shown = run_json(&[&show[..], &["--json"]].concat());
    assert_eq!(shown["status"], "PENDING");
    assert_eq!(shown["key"], key);
    let release = key_args(
        "release",
        &table,
        &tenant,
        "billing::charge",
        r#"[8, "order-3"]"#,
    );
    let released = run_json(&[&release[..], &["--yes", "--json"]].concat());
    assert_eq!(released["released"], true);
    assert_eq!(
        store.get(&key).await.unwrap().unwrap().status,
        Status::Failed
    );
}

#[test]
fn capacity_from_first_principles() {
    let plain = run_json(&[&CAPACITY[..], &["--json"]].concat());
    assert_eq!(plain["total_wcu"], 4300);
    assert_eq!(plain["claims_wcu"], 2000);
    assert_eq!(plain["completions_wcu"], 2000);
    assert_eq!(plain["duplicates_wcu"], 300);
    let transactional = run_json(
        &[
            &CAPACITY[..],
            &["--transactional", "--business-items", "1", "--json"],
        ]
        .concat(),
    );
    assert_eq!(transactional["total_wcu"], 10300);
    let text = run_text(&CAPACITY);
    assert!(text.contains("total               4300 WCU/s"), "{text}");
    assert!(
        text.contains("peak × (1 + duplicate ratio) = 2300 undercounts"),
        "{text}"
    );
}

/// An empty directory of its own, for a `HOME` without AWS configuration.
fn empty_dir(prefix: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(table_name(prefix));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `table check --table TABLE` against the test's endpoint, in an environment of nothing but `HOME`
/// and `env`: how the command finds (or does not find) credentials.
fn check_in_bare_env(
    table: &str,
    home: &std::path::Path,
    env: &[(&str, &str)],
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_idempotent"))
        .args([
            "--endpoint",
            &endpoint(),
            "table",
            "check",
            "--table",
            table,
        ])
        .env_clear()
        .env("HOME", home)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// With `--endpoint` and no credentials anywhere (no `AWS_*` variables, a `HOME` without `.aws`), the
/// command uses dummy ones, as DynamoDB Local wants, and says so; it does not wait for the EC2
/// instance metadata service first. With credentials configured, it uses them, silently.
#[test]
fn an_endpoint_without_credentials_uses_dummy_ones_at_once_and_says_so() {
    const NOTICE: &str = "no AWS credentials configured; using dummy ones for --endpoint";
    let home = empty_dir("cli-home");
    let table = table_name("cli-dummy");
    let started = std::time::Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_idempotent"))
        .args([
            "--endpoint",
            &endpoint(),
            "table",
            "create",
            "--table",
            &table,
            "--json",
        ])
        .env_clear()
        .env("HOME", &home)
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(NOTICE), "{stderr}");
    assert!(stderr.contains(&endpoint()), "{stderr}");
    assert_eq!(json(&output)["status"], "ACTIVE");
    // Creating a table on DynamoDB Local takes well under a second; the instance metadata service's
    // timeouts alone take longer than this.
    assert!(
        elapsed < std::time::Duration::from_secs(4),
        "took {elapsed:?}: waited for credentials"
    );

    // Configured credentials are used, without a notice.
    let output = check_in_bare_env(
        &table,
        &home,
        &[
            ("AWS_ACCESS_KEY_ID", "configured"),
            ("AWS_SECRET_ACCESS_KEY", "configured"),
        ],
    );
    assert!(stdout(&output).contains("fits the store"));
    assert!(!String::from_utf8_lossy(&output.stderr).contains(NOTICE));
    // A profile in `HOME` counts as configured too.
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::write(
        home.join(".aws/credentials"),
        "[default]\naws_access_key_id = profile\naws_secret_access_key = profile\n",
    )
    .unwrap();
    let output = check_in_bare_env(&table, &home, &[]);
    assert!(stdout(&output).contains("fits the store"));
    assert!(!String::from_utf8_lossy(&output.stderr).contains(NOTICE));
    // A configuration that is there but fails (a credential process that exits with an error) is not
    // "none": no dummy credentials, and the error says what failed.
    std::fs::write(
        home.join(".aws/credentials"),
        "[default]\ncredential_process = /bin/false\n",
    )
    .unwrap();
    let output = check_in_bare_env(&table, &home, &[]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains(NOTICE), "{stderr}");
    assert!(stderr.contains("external process exited"), "{stderr}");
    std::fs::remove_dir_all(&home).unwrap();
}

/// `--http IDENTITY KEY` and `--namespace` are refused where they mean nothing.
#[test]
fn key_show_http_takes_an_identity_and_a_key_and_no_function_key() {
    let refused = |args: &[&str]| {
        let output = idempotent(args);
        assert!(!output.status.success(), "{args:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let err = refused(&["key", "show", "--table", "t", "--http", "acme"]);
    assert!(err.contains("IDENTITY") && err.contains("KEY"), "{err}");
    let err = refused(&[
        "key",
        "show",
        "--table",
        "t",
        "billing::charge",
        "[7]",
        "--namespace",
        "n",
    ]);
    assert!(err.contains("--http"), "{err}");
    let err = refused(&[
        "key",
        "show",
        "--table",
        "t",
        "--http",
        "acme",
        "k",
        "billing::charge",
    ]);
    assert!(err.contains("cannot be used with"), "{err}");
    let err = refused(&["key", "show", "--table", "t", "--http", "acme", "\"open"]);
    assert!(
        err.contains("the quoted `Idempotency-Key` is malformed"),
        "{err}"
    );
}

/// A request through the HTTP layer, then `key show --http` finds its record by the caller's identity
/// and the header as sent (quoted or not), in the layer's namespace.
#[cfg(feature = "axum")]
#[tokio::test]
async fn key_show_http_finds_a_layers_record() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use idempotent_runtime::http::IdempotencyLayer;

    let (table, _, idem) = setup("cli-http");
    let layer = IdempotencyLayer::new(idem, |parts: &axum::http::request::Parts| {
        parts
            .headers
            .get("x-tenant")?
            .to_str()
            .ok()
            .map(str::to_owned)
    })
    .namespace("payments");
    let mut app = axum::Router::new().route(
        "/pay",
        axum::routing::post(|| async { (StatusCode::CREATED, "paid") }).layer(layer),
    );
    let request = Request::post("/pay")
        .header("x-tenant", "acme")
        .header("idempotency-key", "\"order-1\"")
        .body(Body::from("{}"))
        .unwrap();
    let response = tower_service::Service::call(&mut app, request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);

    let show = |extra: &[&str]| {
        idempotent(&[&["key", "show", "--table", &table][..], extra, &["--json"]].concat())
    };
    for key in ["order-1", "\"order-1\""] {
        let shown = json(&show(&["--http", "acme", key, "--namespace", "payments"]));
        assert_eq!(shown["status"], "COMPLETED");
        assert_eq!(
            shown["key"],
            idempotent_runtime::derive_http_key("payments", "acme", "order-1").unwrap()
        );
        assert!(
            shown["response_preview"].as_str().unwrap().contains("paid"),
            "{shown}"
        );
    }
    // Another caller's key, or the default namespace, is another record.
    for args in [
        &["--http", "globex", "order-1", "--namespace", "payments"][..],
        &["--http", "acme", "order-1"][..],
    ] {
        let missing = show(args);
        assert!(!missing.status.success());
        let err = String::from_utf8_lossy(&missing.stderr);
        assert!(
            err.contains("no record for") && err.contains("layer's"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn audit_and_keys_end_to_end_with_json() {
    let table = table_name("cli-audit");
    let created = json(&idempotent(&[
        "table", "create", "--table", &table, "--stream", "--json",
    ]));
    assert_eq!(created["stream"]["enabled"], true, "{created}");
    assert_eq!(created["stream"]["view_type"], "NEW_AND_OLD_IMAGES");
    let text = stdout(&idempotent(&["table", "check", "--table", &table]));
    assert!(
        text.contains("stream        on (NEW_AND_OLD_IMAGES)"),
        "{text}"
    );
    let store = idempotent_runtime::DynamoDbStore::new(client(), &table);
    let idem = Idempotency::builder(store.clone()).build();
    for n in [1, 2] {
        let _: u32 = idem
            .operation("billing::charge", &n)
            .run(|_| async { Ok::<_, idempotent_runtime::Error>(n) })
            .await
            .unwrap();
    }
    // A user deletes one: not TTL's.
    let deleted = idempotent_runtime::derive_key("billing::charge", &2).unwrap();
    client()
        .delete_item()
        .table_name(&table)
        .set_key(Some(store.item_key(&deleted).unwrap()))
        .send()
        .await
        .unwrap();
    let audit = json(&idempotent(&[
        "audit",
        "--table",
        &table,
        "--json",
        "--idle-polls",
        "2",
        "--poll-interval",
        "20ms",
    ]));
    assert_eq!(audit["table"], table.as_str());
    assert_eq!(audit["findings"], serde_json::json!([]), "{audit}");
    let summary = &audit["summary"];
    assert_eq!(summary["other_deletions"], 1, "{audit}");
    assert_eq!(summary["late_retries"], 0, "{audit}");
    assert_eq!(summary["ttl_deletions_by_expiry"], 0, "{audit}");
    // Two claims, two completions, one delete.
    assert_eq!(audit["stream"]["records"], 5, "{audit}");
    assert_eq!(summary["changes"], 5, "{audit}");
    let text = stdout(&idempotent(&[
        "audit",
        "--table",
        &table,
        "--idle-polls",
        "1",
        "--poll-interval",
        "10ms",
    ]));
    assert!(text.contains("other deletions    1"), "{text}");
    assert!(text.contains("late retries       0"), "{text}");
    // DynamoDB Local's stream times are whole minutes: the figures say so.
    assert!(text.contains("rounds down to the minute"), "{text}");

    let stats = json(&idempotent(&["keys", "stats", "--table", &table, "--json"]));
    assert_eq!(stats["scanned"], 1, "{stats}");
    assert_eq!(stats["groups"][0]["namespace"], "billing::charge");
    assert_eq!(stats["groups"][0]["status"], "COMPLETED");
    assert_eq!(stats["groups"][0]["count"], 1);
    let list = json(&idempotent(&[
        "keys",
        "list",
        "--table",
        &table,
        "--status",
        "completed",
        "--json",
    ]));
    let kept = idempotent_runtime::derive_key("billing::charge", &1).unwrap();
    assert_eq!(list["keys"][0]["key"], kept.as_str(), "{list}");
    assert_eq!(list["keys"].as_array().map(Vec::len), Some(1));
    let text = stdout(&idempotent(&["keys", "list", "--table", &table]));
    assert!(
        text.contains(&kept) && text.contains("1 records listed of 1 items scanned"),
        "{text}"
    );

    let bad = idempotent(&["keys", "list", "--table", &table, "--status", "done"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("expected `pending`, `completed` or `failed`"),
        "{err}"
    );

    // A table without a stream: the error says how to turn it on.
    let (plain, _, _) = setup("cli-nostream");
    let refused = idempotent(&["audit", "--table", &plain]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("has no stream") && err.contains("--stream"),
        "{err}"
    );
}

/// A configuration that names credentials but is broken — `AWS_PROFILE` naming a profile that does not
/// exist, an access key without its secret — is not "no credentials": the command does not fall back to
/// dummy ones (which would hide the mistake, and which real AWS refuses with a misleading "access
/// denied"), and its error names what is wrong.
#[test]
fn an_endpoint_with_a_broken_credentials_configuration_does_not_use_dummy_ones() {
    const NOTICE: &str = "no AWS credentials configured; using dummy ones for --endpoint";
    let home = empty_dir("cli-broken");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::write(
        home.join(".aws/credentials"),
        "[default]\naws_access_key_id = profile\naws_secret_access_key = profile\n",
    )
    .unwrap();
    let run = |env: &[(&str, &str)]| {
        let output = check_in_bare_env("absent", &home, env);
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, stderr) = run(&[("AWS_PROFILE", "no-such-profile")]);
    assert!(!ok, "{stderr}");
    assert!(!stderr.contains(NOTICE), "{stderr}");
    assert!(stderr.contains("no-such-profile"), "{stderr}");
    // Without the profile file: the access key alone, its secret forgotten.
    std::fs::remove_dir_all(home.join(".aws")).unwrap();
    let (ok, stderr) = run(&[("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")]);
    assert!(!ok, "{stderr}");
    assert!(!stderr.contains(NOTICE), "{stderr}");
    std::fs::remove_dir_all(&home).unwrap();
}

/// `key show --http IDENTITY KEY` names exactly the record the layer writes, for odd identities and
/// keys (unicode, quotes, empty, the longest key), and refuses what the layer refuses with 400 — a key
/// that is not visible ASCII, empty, malformed or too long — rather than name a record that cannot exist.
#[cfg(feature = "axum")]
#[tokio::test]
async fn key_show_http_names_the_layers_record_for_odd_identities_and_keys() {
    use axum::body::Body;
    use axum::http::{HeaderValue, Request, StatusCode};
    use idempotent_runtime::MemoryStore;
    use idempotent_runtime::http::IdempotencyLayer;

    let store = std::sync::Arc::new(MemoryStore::new());
    let idem = Idempotency::builder_arc(store.clone()).build();
    let layer = IdempotencyLayer::new(idem, |parts: &axum::http::request::Parts| {
        let id = parts.headers.get("x-id")?.as_bytes();
        String::from_utf8(id.to_vec()).ok()
    })
    .namespace("odd");
    let mut app = axum::Router::new().route(
        "/pay",
        axum::routing::post(|| async { (StatusCode::CREATED, "paid") }).layer(layer),
    );
    let long = "k".repeat(255);
    let too_long = "k".repeat(256);
    let cases: [(&str, &[u8]); 9] = [
        ("acme", b"order-1"),
        ("Z\u{fc}rich \"quoted\"", b"\"with \\\"escapes\\\" inside\""),
        ("", b"empty-identity"),
        ("acme", long.as_bytes()),
        ("acme", too_long.as_bytes()),
        ("acme", "\u{43a}\u{43b}\u{44e}\u{447}".as_bytes()),
        ("acme", b"\"open"),
        ("acme", b"\"\""),
        ("acme", b"tab\tinside"),
    ];
    for (identity, header) in cases {
        let request = Request::post("/pay")
            .header(
                "x-id",
                HeaderValue::from_bytes(identity.as_bytes()).unwrap(),
            )
            .header("idempotency-key", HeaderValue::from_bytes(header).unwrap())
            .body(Body::from("{}"))
            .unwrap();
        let status = tower_service::Service::call(&mut app, request)
            .await
            .unwrap()
            .status();
        let as_typed = String::from_utf8(header.to_vec()).unwrap();
        let derived = idempotent_runtime::derive_http_key("odd", identity, &as_typed);
        match status {
            StatusCode::CREATED => {
                let key = derived.unwrap_or_else(|e| panic!("{identity:?} {as_typed:?}: {e}"));
                let record = store.get(&key).await.unwrap();
                assert!(
                    record.is_some(),
                    "{identity:?} {as_typed:?}: no record at {key}"
                );
            }
            StatusCode::BAD_REQUEST => assert!(
                derived.is_err(),
                "{identity:?} {as_typed:?}: the layer refused it, the command names {derived:?}"
            ),
            other => panic!("{identity:?} {as_typed:?}: {other}"),
        }
    }
}

/// Text from a record (an error, a response) may hold terminal escape sequences: a body's error often
/// echoes its caller's input, and an item may be written by someone else. The human output shows them
/// escaped, so that a record cannot retitle the terminal, erase a line or draw a fake one; `--json`
/// keeps the text, as JSON escapes it.
#[tokio::test]
async fn record_text_is_printed_with_control_characters_escaped() {
    use idempotent_runtime::aws_sdk_dynamodb::types::AttributeValue;
    let (table, _, _) = setup("cli-escape");
    let hostile = "declined\r\u{1b}[2Kstatus     COMPLETED (attempt 1)\u{1b}]0;owned\u{7}";
    let expires = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600)
        .to_string();
    let put = |key: &str, status: &str, extra: (&str, AttributeValue)| {
        let item = [
            (
                "pk",
                AttributeValue::S(idempotent_runtime::derive_key("billing::charge", key).unwrap()),
            ),
            ("status", AttributeValue::S(status.into())),
            ("token", AttributeValue::S("t".into())),
            ("attempt", AttributeValue::N("1".into())),
            ("expires_at", AttributeValue::N(expires.clone())),
            (extra.0, extra.1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        client()
            .put_item()
            .table_name(&table)
            .set_item(Some(item))
            .send()
    };
    put(
        "order-9",
        "FAILED",
        ("error", AttributeValue::S(hostile.into())),
    )
    .await
    .unwrap();
    let response = format!("\"{hostile}\"");
    put(
        "order-10",
        "COMPLETED",
        (
            "response",
            AttributeValue::B(response.clone().into_bytes().into()),
        ),
    )
    .await
    .unwrap();
    let escaped = r"declined\r\u{1b}[2Kstatus     COMPLETED (attempt 1)\u{1b}]0;owned\u{7}";
    let clean = |text: &str| {
        assert!(
            !text.contains(['\u{1b}', '\u{7}', '\r']),
            "a control character was printed raw: {text:?}"
        );
    };
    let failed = run_text(&key_args(
        "show",
        &table,
        &[],
        "billing::charge",
        "\"order-9\"",
    ));
    clean(&failed);
    assert!(
        failed.contains(&format!("error      {escaped}")),
        "{failed}"
    );
    let completed = run_text(&key_args(
        "show",
        &table,
        &[],
        "billing::charge",
        "\"order-10\"",
    ));
    clean(&completed);
    assert!(completed.contains(&format!("\"{escaped}\"")), "{completed}");
    let list = run_text(&["keys", "list", "--table", &table]);
    clean(&list);
    assert!(list.contains(escaped), "{list}");
    let stats = run_text(&["keys", "stats", "--table", &table]);
    clean(&stats);
    assert!(stats.contains(escaped), "{stats}");
    // `--json` keeps the record's text as it is.
    let shown = run_json(&key_args(
        "show",
        &table,
        &["--json"],
        "billing::charge",
        "\"order-9\"",
    ));
    assert_eq!(shown["error"], hostile);
    let shown = run_json(&key_args(
        "show",
        &table,
        &["--json"],
        "billing::charge",
        "\"order-10\"",
    ));
    assert_eq!(shown["response_preview"], response);
}

/// `audit --endpoint` with no credentials configured reads the stream with the same dummy credentials
/// every other command uses there (the streams client once got none, and failed with
/// "`DescribeStream` failed: unhandled error"); with a credentials configuration that fails, its error
/// says that credentials are the cause.
#[tokio::test]
async fn audit_with_an_endpoint_and_no_credentials_reads_the_stream() {
    const NOTICE: &str = "no AWS credentials configured; using dummy ones for --endpoint";
    let table = table_name("cli-audit-bare");
    run_text(&["table", "create", "--table", &table, "--stream"]);
    let idem =
        Idempotency::builder(idempotent_runtime::DynamoDbStore::new(client(), &table)).build();
    let _: u32 = idem
        .operation("billing::charge", &1)
        .run(|_| async { Ok::<_, idempotent_runtime::Error>(1) })
        .await
        .unwrap();
    let home = empty_dir("cli-audit-home");
    let audit = |home: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_idempotent"))
            .args([
                "--endpoint",
                &endpoint(),
                "audit",
                "--table",
                &table,
                "--json",
                "--idle-polls",
                "2",
                "--poll-interval",
                "20ms",
            ])
            .env_clear()
            .env("HOME", home)
            .output()
            .unwrap()
    };
    let output = audit(&home);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(NOTICE), "{stderr}");
    // The notice once: one configuration for both clients.
    assert_eq!(stderr.matches(NOTICE).count(), 1, "{stderr}");
    let report = json(&output);
    // One claim, one completion.
    assert_eq!(report["stream"]["records"], 2, "{report}");
    assert_eq!(report["summary"]["changes"], 2, "{report}");

    // Credentials configured but failing: the error names them.
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::write(
        home.join(".aws/credentials"),
        "[default]\ncredential_process = /bin/false\n",
    )
    .unwrap();
    let output = audit(&home);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains(NOTICE), "{stderr}");
    assert!(stderr.contains("AWS credentials"), "{stderr}");
    assert!(!stderr.contains("unhandled error"), "{stderr}");
    std::fs::remove_dir_all(&home).unwrap();
}
