//! A crash in the middle of a body with steps, on DynamoDB Local: a process running a three-step
//! checkout is killed with SIGKILL after its second step; a new process calls again once the lease ran
//! out, and resumes at the third step. Each step's effect is counted in a file (outside both
//! processes): each happened exactly once, and a later call replays the result.
//!
//! The processes are this test binary, run again on its ignored `checkout_process` test.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use idempotent_runtime::{DynamoDbStore, Error, Idempotency};

const ROLE_VAR: &str = "STEPS_CRASH_ROLE";
const DIR_VAR: &str = "STEPS_CRASH_DIR";
const TABLE_VAR: &str = "STEPS_CRASH_TABLE";
const LEASE: Duration = Duration::from_secs(2);

/// Appends one line to `dir/step`: the step's effect, visible to every process.
fn effect(dir: &Path, step: &str) {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(step))
        .unwrap();
    writeln!(file, "{}", std::process::id()).unwrap();
    file.sync_all().unwrap();
}

/// How often `step`'s effect happened.
fn effects(dir: &Path, step: &str) -> usize {
    std::fs::read_to_string(dir.join(step)).map_or(0, |text| text.lines().count())
}

/// The checkout a process runs: reserve → charge (with its downstream key) → email. With role
/// `crash`, the email step never finishes (the parent kills the process once the charge is stored).
async fn checkout(idem: &Idempotency, dir: &Path, crash: bool) -> Result<String, Error> {
    idem.operation("steps-crash::checkout", "order-1")
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("reserve", || async {
                    effect(dir, "reserve");
                    Ok::<_, Error>(7_u32)
                })
                .await?;
            let key = steps.key("charge");
            let charge = steps
                .run("charge", || async {
                    effect(dir, "charge");
                    Ok::<_, Error>(format!("ch_{}", &key[..12]))
                })
                .await?;
            if crash {
                // The charge is stored: tell the parent, which kills this process. Written aside and
                // renamed into place, so that the parent never reads the file half written.
                std::fs::write(dir.join("charged.partial"), &charge).unwrap();
                std::fs::rename(dir.join("charged.partial"), dir.join("charged")).unwrap();
                std::future::pending::<()>().await;
            }
            steps
                .run("email", || async {
                    effect(dir, "email");
                    Ok::<_, Error>(())
                })
                .await?;
            Ok(charge)
        })
        .await
}

/// One process's part, run by `a_crash_after_two_steps_runs_only_the_third_again`.
#[tokio::test]
#[ignore = "run by a_crash_after_two_steps_runs_only_the_third_again in a process of its own"]
async fn checkout_process() {
    let role = std::env::var(ROLE_VAR).expect("run by the crash test");
    let dir = PathBuf::from(std::env::var(DIR_VAR).unwrap());
    let (client, _) = idempotent_tests::client();
    let store = DynamoDbStore::new(client, std::env::var(TABLE_VAR).unwrap());
    let idem = Idempotency::builder(store).default_lease(LEASE).build();
    let receipt = checkout(&idem, &dir, role == "crash").await.unwrap();
    std::fs::write(dir.join(format!("receipt-{role}")), receipt).unwrap();
}

fn process(role: &str, dir: &Path, table: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            &idempotent_tests::test_path(module_path!(), "checkout_process"),
            "--nocapture",
        ])
        .env(ROLE_VAR, role)
        .env(DIR_VAR, dir)
        .env(TABLE_VAR, table)
        .env(idempotent_tests::ENDPOINT_VAR, idempotent_tests::endpoint())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn a_crash_after_two_steps_runs_only_the_third_again() {
    let dir = std::env::temp_dir().join(idempotent_tests::unique_table("steps-crash"));
    std::fs::create_dir_all(&dir).unwrap();
    let table = idempotent_tests::unique_table("steps-crash");
    let (client, _) = idempotent_tests::client();
    DynamoDbStore::new(client.clone(), &table)
        .create_table()
        .await
        .unwrap();

    // The first process is killed (SIGKILL: no destructor, no release) once the charge is stored.
    let mut first = process("crash", &dir, &table);
    let deadline = Instant::now() + Duration::from_mins(1);
    while !dir.join("charged").exists() {
        assert!(
            Instant::now() < deadline,
            "the first process never charged: {:?}",
            first.try_wait()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().unwrap();
    let status = first.wait().unwrap();
    assert!(!status.success(), "the first process was not killed");
    assert_eq!(
        (
            effects(&dir, "reserve"),
            effects(&dir, "charge"),
            effects(&dir, "email")
        ),
        (1, 1, 0)
    );
    let charged = std::fs::read_to_string(dir.join("charged")).unwrap();

    // Once its lease (and the clock-skew margin) ran out, a new process takes the key over.
    tokio::time::sleep(LEASE + Duration::from_secs(2)).await;
    let second = process("resume", &dir, &table).wait_with_output().unwrap();
    assert!(
        second.status.success(),
        "the second process failed:\n{}\n{}",
        String::from_utf8_lossy(&second.stdout),
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(
        (
            effects(&dir, "reserve"),
            effects(&dir, "charge"),
            effects(&dir, "email")
        ),
        (1, 1, 1),
        "a step ran again, or the third did not run"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("receipt-resume")).unwrap(),
        charged,
        "the resumed call charged under another key"
    );

    // And the result is replayed afterwards, in this process, without any step running.
    let store = DynamoDbStore::new(client, &table);
    let idem = Idempotency::builder(store).default_lease(LEASE).build();
    assert_eq!(checkout(&idem, &dir, false).await.unwrap(), charged);
    assert_eq!(
        (
            effects(&dir, "reserve"),
            effects(&dir, "charge"),
            effects(&dir, "email")
        ),
        (1, 1, 1)
    );
    std::fs::remove_dir_all(&dir).ok();
}
