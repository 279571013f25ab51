//! `idempotent`: provision and verify the table, inspect and release keys, size capacity.
//!
//! ```text
//! idempotent table create --table idempotency
//! idempotent table create --table idempotency --layout tenant
//! idempotent table check --table idempotency
//! idempotent key show --table idempotency billing::charge '[7, "order-1"]'
//! idempotent key release --table idempotency billing::charge '[7, "order-1"]'
//! idempotent capacity --peak-rps 2000 --duplicate-ratio 0.15 --response-bytes 200
//! idempotent table create --table idempotency --stream
//! idempotent audit --table idempotency --since 6h --ttl 24h
//! idempotent keys list --table idempotency --status pending --older-than 10m
//! idempotent keys stats --table idempotency
//! ```
//!
//! The AWS configuration is the usual one (environment, profile, role); `--endpoint` (or
//! `IDEMPOTENT_DYNAMODB_ENDPOINT`) points it at DynamoDB Local, and then, when no credentials are
//! configured (no `AWS_*` variables, no profile), uses dummy ones and says so on stderr, without
//! asking the EC2 instance metadata service. An HTTP layer's record is named by the caller's identity
//! and the `Idempotency-Key` header, in the layer's namespace (default `http`):
//!
//! ```text
//! idempotent key show --table idempotency --http acme order-1 --namespace payments
//! ```
//!
//! Inside this repository: `cargo run -p idempotent-runtime --features cli --bin idempotent -- …`. `--json` prints one JSON document for
//! scripts. `--layout` (`key`, the default; `static-pk`, `static-pk=VALUE`; `tenant`) names the
//! table's layout, as the application's `DynamoDbStore::with_layout` does.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use aws_credential_types::provider::error::CredentialsError;
use clap::{Args, Parser, Subcommand};
use idempotent_runtime::admin::{self, KeyReport, Released, Traffic};
// Every text taken from a record (a key, a namespace, an error, a region, a response) is printed
// through it: a record may hold terminal escape sequences (`--json` escapes them as JSON does).
use idempotent_runtime::aws_sdk_dynamodb::Client;
use idempotent_runtime::aws_sdk_dynamodb::config::{
    Credentials, ProvideCredentials as _, SharedCredentialsProvider,
};
use idempotent_runtime::telemetry::escaped;
use idempotent_runtime::{Clock as _, DynamoDbStore, Layout, Store as _, SystemClock, TableReport};

#[derive(Debug, Parser)]
#[command(
    name = "idempotent",
    version,
    about = "Operate the idempotency table of idempotent-runtime"
)]
struct Cli {
    /// DynamoDB endpoint, e.g. DynamoDB Local's `http://127.0.0.1:8000` (default: AWS's).
    #[arg(long, global = true, env = "IDEMPOTENT_DYNAMODB_ENDPOINT")]
    endpoint: Option<String>,
    /// AWS region (default: the AWS configuration's; `us-east-1` with `--endpoint`).
    #[arg(long, global = true)]
    region: Option<String>,
    /// Print one JSON document instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or verify the idempotency table.
    #[command(subcommand)]
    Table(TableCommand),
    /// Inspect or release one key's record.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Write capacity per second for a traffic profile, from first principles.
    Capacity(CapacityArgs),
    /// Read the table's stream: records TTL deleted, and keys claimed again after their deletion.
    Audit(AuditArgs),
    /// List or count the table's records (a parallel Scan).
    #[command(subcommand)]
    Keys(KeysCommand),
}

#[derive(Debug, Args)]
struct AuditArgs {
    /// The idempotency table (its stream must be on, with old and new images: `table create --stream`).
    #[arg(long)]
    table: String,
    /// The table's layout, as for `table create`.
    #[arg(long, default_value = "key")]
    layout: Layout,
    /// Keep reading new records until interrupted (with `--json`: one JSON document per line). Without
    /// it, the run reads what the stream held when it started, and ends.
    #[arg(long)]
    follow: bool,
    /// Report only what happened in the last DURATION (e.g. `6h`); older records still pair deletions
    /// with later claims. Default: all the stream holds (24 hours).
    #[arg(long, value_parser = humantime::parse_duration)]
    since: Option<Duration>,
    /// The functions' `ttl`, to report each deleted record's age since its completion.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// How long after a deletion a claim still counts as a late retry.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "7d")]
    window: Duration,
    /// Without `--follow`: an open shard counts as read after this many empty reads in a row.
    #[arg(long, default_value_t = 3)]
    idle_polls: u32,
    /// The wait after a round of reads that found nothing new.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    poll_interval: Duration,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// List records, decoded: stuck claims, failures, ...
    List(KeysListArgs),
    /// Count records by namespace and status: sizes, expired, PENDING past their lease, FAILED by error.
    Stats(KeysArgs),
}

#[derive(Debug, Args)]
struct KeysArgs {
    /// The idempotency table.
    #[arg(long)]
    table: String,
    /// The table's layout, as for `table create`.
    #[arg(long, default_value = "key")]
    layout: Layout,
    /// Parallel Scan segments (one request in flight each).
    #[arg(long, default_value_t = 4)]
    segments: u32,
}

#[derive(Debug, Args)]
struct KeysListArgs {
    #[command(flatten)]
    keys: KeysArgs,
    /// Only records in this status: `pending`, `completed` or `failed`.
    #[arg(long, value_parser = parse_status)]
    status: Option<idempotent_runtime::Status>,
    /// Only records that stopped holding their key at least DURATION ago (a PENDING claim's lease ran
    /// out; a COMPLETED or FAILED record expired), e.g. `10m`.
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Only records of this namespace.
    #[arg(long)]
    namespace: Option<String>,
    /// List at most this many (the first by key); all matching records are counted.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
}

fn parse_status(s: &str) -> Result<idempotent_runtime::Status, String> {
    idempotent_runtime::Status::parse(&s.to_ascii_uppercase())
        .ok_or_else(|| format!("unknown status `{s}`; expected `pending`, `completed` or `failed`"))
}

#[derive(Debug, Subcommand)]
enum TableCommand {
    /// Create the table if missing, wait until it is ACTIVE, enable TTL; verify it.
    Create(TableArg),
    /// Verify the table without changing it.
    Check(TableArg),
}

#[derive(Debug, Args)]
struct TableArg {
    /// The idempotency table.
    #[arg(long)]
    table: String,
    /// The table's layout: `key` (partition key = the record key), `static-pk[=VALUE]` (one partition
    /// VALUE, default `idempotency`; sort key = the record key) or `tenant` (partition key = the
    /// namespace; sort key = the key's hash).
    #[arg(long, default_value = "key")]
    layout: Layout,
    /// `table create`: also turn on the table's stream with old and new images (for `idempotent
    /// audit`).
    #[arg(long)]
    stream: bool,
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Print a key's record, decoded.
    Show(KeyArgs),
    /// Move a stuck PENDING record to FAILED (fenced by the token just read), so the key may run again.
    Release {
        #[command(flatten)]
        key: KeyArgs,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
struct KeyArgs {
    /// The idempotency table.
    #[arg(long)]
    table: String,
    /// The table's layout, as for `table create`.
    #[arg(long, default_value = "key")]
    layout: Layout,
    /// The function's namespace: its `name = ".."`, or `module::path::fn_name`.
    #[arg(required_unless_present = "http", conflicts_with = "http")]
    namespace: Option<String>,
    /// The key as JSON, as the function's `key = ..` serializes it: a tuple key is an array, e.g.
    /// '[7, "order-1"]'.
    #[arg(required_unless_present = "http", conflicts_with = "http")]
    key: Option<String>,
    /// An HTTP layer's record instead: the caller's identity (what the layer's identity function
    /// returned) and the request's `Idempotency-Key` header, as sent (quoted or not).
    #[arg(long, num_args = 2, value_names = ["IDENTITY", "KEY"])]
    http: Option<Vec<String>>,
    /// With `--http`: the layer's namespace (`IdempotencyLayer::namespace`; default `http`).
    #[arg(long = "namespace", value_name = "NAMESPACE")]
    http_namespace: Option<String>,
}

impl KeyArgs {
    /// The record key: the function's namespace and JSON key, or the HTTP layer's.
    fn record_key(&self) -> Result<String, Failure> {
        if let Some([identity, key]) = self.http.as_deref() {
            let namespace = self
                .http_namespace
                .as_deref()
                .unwrap_or(idempotent_runtime::DEFAULT_HTTP_NAMESPACE);
            return Ok(idempotent_runtime::derive_http_key(
                namespace, identity, key,
            )?);
        }
        if self.http_namespace.is_some() {
            return Err("`--namespace` is an HTTP layer's namespace: use it with `--http IDENTITY KEY` (a function's namespace is the first argument)".into());
        }
        let (Some(namespace), Some(key)) = (&self.namespace, &self.key) else {
            return Err("name the record: NAMESPACE KEY, or --http IDENTITY KEY".into());
        };
        let key: serde_json::Value = serde_json::from_str(key).map_err(|e| {
            format!(
                "the key {key:?} is not JSON ({e}); write it as the function's key serializes, e.g. '[7, \"order-1\"]' for a tuple"
            )
        })?;
        Ok(idempotent_runtime::derive_key(namespace, &key)?)
    }
}

#[derive(Debug, Args)]
struct CapacityArgs {
    /// First calls (new keys) per second at peak.
    #[arg(long)]
    peak_rps: f64,
    /// Duplicates per first call that reach the table (0.15: 15% more calls, all duplicates). A
    /// duplicate arriving in the process where a call on its key is in flight costs nothing (it
    /// follows that call: coalescing, on unless `Builder::coalesce(false)`), so count only duplicates
    /// that arrive at other processes, or after the
    /// first call ended (and, with a local cache, not at the process that cached the response).
    #[arg(long, default_value_t = 0.0)]
    duplicate_ratio: f64,
    /// The stored response's size in bytes.
    #[arg(long, default_value_t = 0)]
    response_bytes: u64,
    /// Completions are transactions with business writes (`transact = tx`).
    #[arg(long)]
    transactional: bool,
    /// Business items written per transactional completion.
    #[arg(long, default_value_t = 1)]
    business_items: u64,
    /// Each business item's size in bytes.
    #[arg(long, default_value_t = 512)]
    business_item_bytes: u64,
    /// The body's running time in seconds (adds a heartbeat per third of the lease).
    #[arg(long)]
    body_seconds: Option<f64>,
    /// The lease in seconds.
    #[arg(long, default_value_t = 60.0)]
    lease_seconds: f64,
    /// Steps per call, for a body run with steps (`.steps()`): one write each.
    #[arg(long, default_value_t = 0)]
    steps: u64,
    /// Each step's stored value in bytes (JSON).
    #[arg(long, default_value_t = 100)]
    step_bytes: u64,
}

/// An error for the user: what went wrong and what to do.
type Failure = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // An error may quote a record (a corrupt item's text).
            eprintln!("idempotent: error: {}", escaped(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: &Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::Capacity(args) => capacity(cli, args),
        Command::Table(TableCommand::Create(t)) => {
            let store = store(cli, &t.table, &t.layout).await;
            let report = store.ensure_table().await?;
            let stream = if t.stream {
                admin::enable_stream(&store).await?
            } else {
                admin::stream_report(&store).await?
            };
            print_table(cli, &report, "ready", &stream);
            Ok(())
        }
        Command::Table(TableCommand::Check(t)) => {
            let store = store(cli, &t.table, &t.layout).await;
            let report = store.check().await?;
            let stream = admin::stream_report(&store).await?;
            print_table(cli, &report, "fits the store", &stream);
            Ok(())
        }
        Command::Audit(args) => audit(cli, args).await,
        Command::Keys(KeysCommand::List(args)) => keys_list(cli, args).await,
        Command::Keys(KeysCommand::Stats(args)) => keys_stats(cli, args).await,
        Command::Key(KeyCommand::Show(k)) => {
            let (store, record) = record(cli, k).await?;
            let _ = store;
            let report = KeyReport::new(&record, SystemClock.now_ms());
            print_key(cli, &report)
        }
        Command::Key(KeyCommand::Release { key, yes }) => release(cli, key, *yes).await,
    }
}

async fn client(cli: &Cli) -> Client {
    Client::new(&sdk_config(cli).await)
}

/// The AWS configuration every client is built from: the usual one, with `--endpoint` and
/// `--region` applied, and for `--endpoint` the credentials of [`endpoint_credentials`]. The audit's
/// streams client comes from the same one, so that it gets the same endpoint and credentials.
async fn sdk_config(cli: &Cli) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    // DynamoDB Local serves its streams at its own endpoint, the endpoint of both clients.
    if let Some(endpoint) = &cli.endpoint {
        loader = loader
            .endpoint_url(endpoint)
            .credentials_provider(endpoint_credentials(endpoint).await);
    }
    let region = cli
        .region
        .clone()
        .or_else(|| cli.endpoint.as_ref().map(|_| "us-east-1".to_owned()));
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region));
    }
    loader.load().await
}

/// The credentials for `--endpoint`: those the AWS configuration has (environment, profile, web
/// identity, container), or, when none is configured, dummy ones (what DynamoDB Local accepts), said
/// on stderr. Never the EC2 instance metadata service, the default chain's last resort, which off EC2
/// makes every command wait for its timeouts first: on EC2 with an endpoint of your own, export the
/// role's credentials.
async fn endpoint_credentials(endpoint: &str) -> SharedCredentialsProvider {
    use aws_config::meta::credentials::CredentialsProviderChain;
    let configured = CredentialsProviderChain::first_try(
        "Environment",
        aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
    )
    .or_else(
        "Profile",
        aws_config::profile::ProfileFileCredentialsProvider::builder().build(),
    )
    .or_else(
        "WebIdentityToken",
        aws_config::web_identity_token::WebIdentityTokenCredentialsProvider::builder().build(),
    )
    .or_else(
        "EcsContainer",
        aws_config::ecs::EcsCredentialsProvider::builder().build(),
    );
    // Asked once, here: unconfigured, every provider answers at once without a request. A
    // configuration that is there but broken is not "none": its error comes with the first request.
    // The SDK reports some broken ones as "not loaded" too (`AWS_PROFILE` naming a profile that does
    // not exist, an access key without its secret), so a variable that names credentials counts as
    // configured whatever the chain answers.
    let named = ["AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        .iter()
        .any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
    match configured.provide_credentials().await {
        Err(CredentialsError::CredentialsNotLoaded(_)) if !named => {}
        // Some providers give their error once (the profile provider's second answer is "already
        // taken"): every request gets this one, which names what is wrong.
        Err(error) => {
            let why = format!(
                "the AWS credentials configured could not be loaded: {}",
                aws_smithy_types::error::display::DisplayErrorContext(&error)
            );
            return SharedCredentialsProvider::new(
                aws_credential_types::credential_fn::provide_credentials_fn(move || {
                    let why = why.clone();
                    async move { Err(CredentialsError::invalid_configuration(why)) }
                }),
            );
        }
        Ok(_) => return SharedCredentialsProvider::new(configured),
    }
    eprintln!(
        "idempotent: no AWS credentials configured; using dummy ones for --endpoint {endpoint} (DynamoDB Local accepts any)"
    );
    SharedCredentialsProvider::new(Credentials::new(
        "dummy",
        "dummy",
        None,
        None,
        "idempotent-endpoint-dummy",
    ))
}

async fn store(cli: &Cli, table: &str, layout: &Layout) -> DynamoDbStore {
    DynamoDbStore::new(client(cli).await, table).with_layout(layout.clone())
}

async fn record(
    cli: &Cli,
    k: &KeyArgs,
) -> Result<(DynamoDbStore, idempotent_runtime::Record), Failure> {
    let pk = k.record_key()?;
    let store = store(cli, &k.table, &k.layout).await;
    let record = store.get(&pk).await?.ok_or_else(|| {
        format!(
            "no record for `{pk}` in table `{}`: the key never ran, its record expired and was deleted, or the namespace or key differs from the {}",
            k.table,
            if k.http.is_some() {
                "layer's (`--namespace`, the identity, the header)"
            } else {
                "function's"
            }
        )
    })?;
    Ok((store, record))
}

async fn release(cli: &Cli, k: &KeyArgs, yes: bool) -> Result<(), Failure> {
    let (store, record) = record(cli, k).await?;
    let now = SystemClock.now_ms();
    let report = KeyReport::new(&record, now);
    if !cli.json {
        print_key(cli, &report)?;
    }
    if !yes {
        eprint!(
            "release this claim? If its worker is still running, its result will not be stored and the next call runs the body again. [y/N] "
        );
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            return Err("not released (answer `y` to release, or pass --yes)".into());
        }
    }
    let outcome = admin::release(&store, &record, now).await?;
    let released = matches!(outcome, Released::Released | Released::Lapsed);
    if cli.json {
        println!(
            "{}",
            serde_json::json!({ "key": report.key, "released": released })
        );
    } else if outcome == Released::Released {
        println!(
            "released: `{}` is FAILED and may be claimed again",
            escaped(&report.key)
        );
    } else if outcome == Released::Lapsed {
        println!(
            "released: `{}` keeps its finished steps and its lease has lapsed: the next call takes it over and resumes",
            escaped(&report.key)
        );
    }
    match outcome {
        Released::Released | Released::Lapsed => Ok(()),
        Released::Changed(now) => Err(format!(
            "the record changed since it was read (now {}); nothing was written",
            now.map_or_else(|| "absent".to_owned(), |r| r.status.to_string())
        )
        .into()),
        Released::NotPending(status) => Err(format!(
            "the record is {status}, not PENDING: there is no claim to release; nothing was written"
        )
        .into()),
        _ => Err("unexpected outcome; nothing was written".into()),
    }
}

fn capacity(cli: &Cli, args: &CapacityArgs) -> Result<(), Failure> {
    let seconds = |s: f64, what: &str| {
        Duration::try_from_secs_f64(s)
            .map_err(|_| format!("`--{what}` must be a number of seconds ≥ 0"))
    };
    if !(args.peak_rps >= 0.0 && args.duplicate_ratio >= 0.0) {
        return Err("`--peak-rps` and `--duplicate-ratio` must be ≥ 0".into());
    }
    let mut traffic = Traffic::new(args.peak_rps, seconds(args.lease_seconds, "lease-seconds")?);
    traffic.duplicate_ratio = args.duplicate_ratio;
    traffic.response_bytes = args.response_bytes;
    traffic.transactional = args.transactional;
    traffic.business_items = if args.transactional {
        args.business_items
    } else {
        0
    };
    traffic.business_item_bytes = args.business_item_bytes;
    traffic.body = args
        .body_seconds
        .map(|s| seconds(s, "body-seconds"))
        .transpose()?;
    traffic.steps = args.steps;
    traffic.step_bytes = args.step_bytes;
    let c = admin::capacity(&traffic);
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
        return Ok(());
    }
    let duplicates = args.peak_rps * args.duplicate_ratio;
    println!(
        "write capacity at peak ({} first calls/s, {duplicates} duplicates/s):",
        args.peak_rps
    );
    println!(
        "  claims        {:>10} WCU/s  (one conditional write per first call)",
        c.claims_wcu
    );
    println!(
        "  completions   {:>10} WCU/s  ({}record of about {} bytes)",
        c.completions_wcu,
        if args.transactional {
            "a transaction, twice per item: the "
        } else {
            "the "
        },
        c.record_bytes
    );
    println!(
        "  duplicates    {:>10} WCU/s  (a failed condition still consumes the existing item's size; duplicates coalesced in one process cost nothing)",
        c.duplicates_wcu
    );
    println!("  heartbeats    {:>10} WCU/s", c.heartbeats_wcu);
    if args.steps > 0 {
        println!(
            "  steps         {:>10} WCU/s  (one write per step, of the record with the steps so far)",
            c.steps_wcu
        );
    }
    println!("  total         {:>10} WCU/s", c.total_wcu);
    println!(
        "the simpler peak × (1 + duplicate ratio) = {} undercounts: a first call makes two writes (claim and completion), not one, and transactions cost double",
        c.reference_wcu
    );
    Ok(())
}

fn print_table(cli: &Cli, report: &TableReport, verdict: &str, stream: &admin::StreamReport) {
    if cli.json {
        let json = serde_json::json!({
            "table": report.table,
            "status": report.status,
            "key_attribute": report.key_attribute,
            "sort_key_attribute": report.sort_key_attribute,
            "layout": report.layout.to_string(),
            "replicas": report.replicas,
            "replication": format!("{:?}", report.replication),
            "ttl_attribute": report.ttl_attribute,
            "billing_mode": report.billing_mode,
            "item_count": report.item_count,
            "stream": stream,
        });
        println!("{json}");
        return;
    }
    println!("table `{}`: {verdict}", report.table);
    println!("  status        {}", report.status);
    println!("  layout        {}", report.layout);
    println!("  partition key {} (S)", report.key_attribute);
    if let Some(sort_key) = &report.sort_key_attribute {
        println!("  sort key      {sort_key} (S)");
    }
    if !report.replicas.is_empty() {
        println!(
            "  replicas      {} ({:?})",
            report.replicas.join(", "),
            report.replication
        );
    }
    match &report.ttl_attribute {
        Some(a) => println!("  TTL           on `{a}`"),
        None => println!(
            "  TTL           off (expiry is enforced by the conditions; enable it with `table create` to reclaim space)"
        ),
    }
    println!("  billing       {}", report.billing_mode);
    let stream_line = match (&stream.view_type, stream.fits_the_audit()) {
        (Some(view), true) => format!("on ({view}): `idempotent audit` can read it"),
        (Some(view), false) => {
            format!("on ({view}): `idempotent audit` needs NEW_AND_OLD_IMAGES")
        }
        (None, _) => "off (`table create --stream` turns it on, for `idempotent audit`)".to_owned(),
    };
    println!("  stream        {stream_line}");
    if let Some(n) = report.item_count {
        println!("  items         about {n} (updated every few hours)");
    }
}

fn print_key(cli: &Cli, r: &KeyReport) -> Result<(), Failure> {
    if cli.json {
        println!("{}", serde_json::to_string_pretty(r)?);
        return Ok(());
    }
    println!("key        {}", escaped(&r.key));
    println!("status     {} (attempt {})", r.status, r.attempt);
    println!("token      {}", escaped(&r.token));
    if let Some(ms) = r.lease_left_ms {
        let seconds = |ms: i64| format!("{}.{}", ms.abs() / 1000, ms.abs() % 1000 / 100);
        if ms >= 0 {
            println!("lease      {} s left", seconds(ms));
        } else {
            println!(
                "lease      ran out {} s ago: the key may be taken over",
                seconds(ms)
            );
        }
    }
    let when = if r.expires_in_s >= 0 { "in" } else { "expired" };
    println!(
        "expires    {} ({when} {} s)",
        r.expires_at_utc,
        r.expires_in_s.abs()
    );
    if let Some(bytes) = r.response_bytes {
        println!("response   {bytes} bytes stored");
        if let Some(preview) = &r.response_preview {
            println!("           {}", escaped(preview));
        }
    }
    if let Some(error) = &r.error {
        println!("error      {}", escaped(error));
    }
    if let Some(region) = &r.completed_in {
        println!("completed  in region {}", escaped(region));
    }
    if r.claim_writes_in_effect {
        println!("claim-time writes are in effect");
    }
    if !r.released.is_empty() {
        println!(
            "released   {} token(s) of calls that gave their claim up; a late claim under one is refused:",
            r.released.len()
        );
        for token in &r.released {
            println!("           {}", escaped(token));
        }
    }
    Ok(())
}

async fn audit(cli: &Cli, args: &AuditArgs) -> Result<(), Failure> {
    use idempotent_runtime::audit::{
        AuditConfig, Auditor, Finding, ReadOptions, StreamReader, stream_arn,
    };
    // One configuration for both clients (and one notice of dummy credentials).
    let sdk = sdk_config(cli).await;
    let store = DynamoDbStore::new(Client::new(&sdk), &args.table).with_layout(args.layout.clone());
    let arn = stream_arn(store.client(), &args.table).await?;
    let now_s = SystemClock.now_ms() / 1000;
    let mut config = AuditConfig::default().window(args.window);
    if let Some(ttl) = args.ttl {
        config = config.ttl(ttl);
    }
    if let Some(since) = args.since {
        config = config.report_from(now_s.saturating_sub(since.as_secs()));
    }
    let mut auditor = Auditor::new(&store, config);
    let options = ReadOptions::default()
        .follow(args.follow)
        .idle_polls(args.idle_polls)
        .poll_interval(args.poll_interval);
    let mut reader = StreamReader::new(aws_sdk_dynamodbstreams::Client::new(&sdk), arn, options);
    let (json, follow) = (cli.json, args.follow);
    let mut findings = Vec::new();
    if !json {
        println!(
            "{:<12} {:<20} {:>9} {:>9}  key",
            "finding", "at (UTC)", "lag s", "gap s"
        );
    }
    reader
        .read(&mut auditor, &mut |finding: Finding| {
            if json && follow {
                println!("{}", serde_json::to_string(&finding).unwrap_or_default());
            } else if json {
                findings.push(finding);
            } else {
                print_finding(&finding);
            }
        })
        .await?;
    let summary = auditor.summary();
    if json {
        let doc = serde_json::json!({
            "table": args.table,
            "findings": findings,
            "summary": summary,
            "stream": reader.stats(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let stats = reader.stats();
    println!();
    println!(
        "read {} stream records from {} shards ({} GetRecords)",
        stats.records, stats.shards, stats.get_records
    );
    println!(
        "TTL deletions      {} ({} by the service identity, {} by expiry)",
        summary.ttl_deletions(),
        summary.ttl_deletions_by_identity,
        summary.ttl_deletions_by_expiry
    );
    if let (Some(min), Some(mean), Some(max)) =
        (summary.min_lag_s, summary.mean_lag_s, summary.max_lag_s)
    {
        println!("deletion lag       min {min} s, mean {mean} s, max {max} s (after expires_at)");
    }
    println!("other deletions    {}", summary.other_deletions);
    println!("late retries       {}", summary.late_retries);
    if let Some(after) = summary.max_retry_after_expiry_s {
        println!(
            "                   the latest came {after} s after its record expired: ttl + retain would need to be {after} s longer"
        );
    }
    if let Some(after) = summary.max_retry_after_completion_s {
        println!(
            "                   and {after} s after its completion: ttl + retain above {after} s answers every late retry seen"
        );
    }
    if cli.endpoint.is_some() && (stats.records > 0) {
        // Verified on DynamoDB Local 3.3: every record of a minute carries that minute's start.
        println!(
            "times              from the stream records' ApproximateCreationDateTime, which DynamoDB Local rounds down to the minute (AWS: to the second): lags and gaps above are exact to 60 s only, and a retry up to 59 s after expiry may show 0 s"
        );
    }
    if summary.not_records > 0 {
        println!(
            "not records        {} (other items in the table)",
            summary.not_records
        );
    }
    if stats.trimmed > 0 || stats.shards_gone > 0 {
        println!(
            "records lost       {} positions trimmed, {} shards gone before they were read",
            stats.trimmed, stats.shards_gone
        );
    }
    Ok(())
}

fn print_finding(finding: &idempotent_runtime::audit::Finding) {
    use idempotent_runtime::audit::Finding;
    let utc = idempotent_runtime::admin::utc_text;
    match finding {
        Finding::TtlDeletion(d) => println!(
            "{:<12} {:<20} {:>9} {:>9}  {} ({}, {})",
            "ttl-delete",
            utc(d.deleted_at_s),
            d.deletion_lag_s,
            "",
            escaped(&d.key),
            d.status,
            d.rule.as_str()
        ),
        Finding::LateRetry(r) => println!(
            "{:<12} {:<20} {:>9} {:>9}  {} ({} s after expiry)",
            "late-retry",
            utc(r.retried_at_s),
            "",
            r.after_deletion_s,
            escaped(&r.key),
            r.after_expiry_s
        ),
        _ => {}
    }
}

/// A progress bar on stderr when it is a terminal; none when piped.
fn progress_bar() -> (indicatif::ProgressBar, admin::Progress) {
    use std::io::IsTerminal as _;
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message("items scanned");
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let shown = bar.clone();
    (bar, std::sync::Arc::new(move |n| shown.set_position(n)))
}

async fn keys_list(cli: &Cli, args: &KeysListArgs) -> Result<(), Failure> {
    let store = store(cli, &args.keys.table, &args.keys.layout).await;
    let mut filter = admin::KeyFilter::default();
    filter.status = args.status;
    filter.older_than = args.older_than;
    filter.namespace.clone_from(&args.namespace);
    let (bar, progress) = progress_bar();
    let list = admin::list_keys(
        &store,
        &filter,
        args.limit,
        args.keys.segments,
        SystemClock.now_ms(),
        progress,
    )
    .await?;
    bar.finish_and_clear();
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<10} {:>7} {:>12} {:>12}  key / error",
        "status", "attempt", "lease left s", "expires in s"
    );
    for k in &list.keys {
        let lease = k
            .lease_left_ms
            .map_or_else(String::new, |ms| (ms / 1000).to_string());
        println!(
            "{:<10} {:>7} {:>12} {:>12}  {}",
            k.status,
            k.attempt,
            lease,
            k.expires_in_s,
            escaped(&k.key)
        );
        if let Some(error) = k.error.as_deref().and_then(|e| e.lines().next()) {
            println!("{:>46}{}", "", escaped(error));
        }
    }
    if list.matched > list.keys.len() as u64 {
        println!(
            "... and {} more (`--limit` lists more; `--status`, `--namespace` and `--older-than` narrow the list)",
            list.matched - list.keys.len() as u64
        );
    }
    println!(
        "{} records listed of {} items scanned{}",
        list.keys.len(),
        list.scanned,
        if list.not_records > 0 {
            format!(" ({} not records, skipped)", list.not_records)
        } else {
            String::new()
        }
    );
    Ok(())
}

async fn keys_stats(cli: &Cli, args: &KeysArgs) -> Result<(), Failure> {
    let store = store(cli, &args.table, &args.layout).await;
    let (bar, progress) = progress_bar();
    let stats = admin::key_stats(&store, args.segments, SystemClock.now_ms(), progress).await?;
    bar.finish_and_clear();
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    println!(
        "{:<32} {:<10} {:>8} {:>12} {:>10} {:>8} {:>10}",
        "namespace", "status", "records", "bytes", "max bytes", "expired", "past lease"
    );
    for g in &stats.groups {
        println!(
            "{:<32} {:<10} {:>8} {:>12} {:>10} {:>8} {:>10}",
            // Padded as text: `escaped` writes without padding.
            escaped(&g.namespace).to_string(),
            g.status,
            g.count,
            g.bytes,
            g.max_bytes,
            g.expired,
            g.past_lease
        );
    }
    if !stats.errors.is_empty() {
        println!();
        println!("FAILED records by error:");
        for e in &stats.errors {
            println!(
                "{:>8}  {}: {}",
                e.count,
                escaped(&e.namespace),
                escaped(&e.error)
            );
        }
    }
    println!();
    println!(
        "{} items scanned{}",
        stats.scanned,
        if stats.not_records > 0 {
            format!(" ({} not records, skipped)", stats.not_records)
        } else {
            String::new()
        }
    );
    Ok(())
}
