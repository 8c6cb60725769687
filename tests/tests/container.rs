//! The container image (`scripts/image.sh` builds it; `scripts/test.sh` runs these after it),
//! run with podman and reached only through its port published on 127.0.0.1: a session, a
//! tab over WebSocket and a call; with the documented flags the MIP sandbox works in the
//! container (two generates at once, then a solve), without them the MIP tools answer
//! `SANDBOX_UNAVAILABLE` and everything else works; SIGTERM drains and exits at once.

use serde_json::json;
use toolrelay_tests::deploy::{Container, a_call_goes_through, call_tool, image, podman_ok};
use toolrelay_tests::repo_file;

/// The flags README ("Container image") documents for the MIP sandbox under podman: root of
/// a user namespace of its own, only the capabilities the sandbox needs, an unmasked /proc,
/// and the hardening the Kubernetes component has too (its seccomp profile, a read-only root,
/// no privilege escalation).
fn sandbox_flags(seccomp: &str) -> Vec<String> {
    [
        "--user",
        "0",
        "--uidmap",
        "0:100000:65536",
        "--gidmap",
        "0:100000:65536",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "SETUID,SETGID,KILL",
        "--security-opt",
        "unmask=/proc/*",
        "--security-opt",
        &format!("seccomp={seccomp}"),
        "--security-opt",
        "no-new-privileges",
        "--read-only",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The README's bakery model: maximum profit 109 (with the objective's constant).
const BAKERY: &str = "import pulp\nprob = pulp.LpProblem(\"bakery\", pulp.LpMaximize)\nbread = pulp.LpVariable(\"bread\", 0, cat=\"Integer\")\ncake = pulp.LpVariable(\"cake\", 0, cat=\"Integer\")\noven = pulp.LpVariable(\"second_oven\", cat=\"Binary\")\nprob += 3 * bread + 8 * cake - 20 * oven + 5, \"profit\"\nprob += bread + 4 * cake <= 40 + 20 * oven, \"oven_hours\"\nprob += 2 * bread + 3 * cake <= 60\nprob += cake - 2 * oven == 4\n";

fn ws_base(container: &Container) -> String {
    container.base.replacen("http://", "ws://", 1)
}

#[tokio::test]
#[ignore = "needs the image: scripts/test.sh builds it (scripts/image.sh) and runs these"]
async fn the_image_is_small_runs_as_a_user_and_stops_on_sigterm() {
    let image = image();
    let config = podman_ok(&[
        "image",
        "inspect",
        "--format",
        "{{.Config.User}}|{{.Config.StopSignal}}|{{json .Config.Cmd}}|{{.Size}}",
        &image,
    ])
    .await;
    let parts: Vec<&str> = config.split('|').collect();
    assert_eq!(
        parts[..3],
        ["10001:10001", "SIGTERM", "[\"toolrelay\"]"],
        "{config}"
    );
    let size: u64 = parts[3].parse().unwrap();
    eprintln!("{image}: {} MB", size / 1_000_000);
    assert!(
        size < 250_000_000,
        "the image grew to {} MB",
        size / 1_000_000
    );

    let container = Container::start(&[], &[]).await;
    a_call_goes_through(&container.base, &ws_base(&container), None).await;
    // Nothing in flight: the drain ends at once, and the process exits 0.
    let (took, code) = container.stop().await;
    assert_eq!(code, 0, "{}", container.logs().await);
    assert!(took.as_secs() < 5, "stopping took {took:?}");
    assert!(container.logs().await.contains("drained"));
}

#[tokio::test]
#[ignore = "needs the image: scripts/test.sh builds it (scripts/image.sh) and runs these"]
async fn with_the_documented_flags_the_mip_tools_work_in_the_container() {
    let seccomp = repo_file("k8s/components/mip-sandbox/relay-seccomp.json");
    let flags = sandbox_flags(seccomp.to_str().unwrap());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let container = Container::start(&flags, &[]).await;
    // The sandbox is checked before the relay listens.
    let logs = container.logs_with("toolrelay listening").await;
    assert!(!logs.contains("sandbox is unavailable"), "{logs}");
    a_call_goes_through(&container.base, &ws_base(&container), None).await;

    // Two generates at once (two scopes: one run at a time per scope), each in a sandbox of
    // its own uid, then a solve.
    let input = json!({"problemDefinitionCode": BAKERY});
    let (first, second) = tokio::join!(
        call_tool(
            &container.base,
            "generate_mip_problem",
            "one",
            input.clone()
        ),
        call_tool(&container.base, "generate_mip_problem", "two", input),
    );
    for generated in [&first, &second] {
        assert_eq!(generated.status.as_u16(), 200, "{generated:?}");
        assert_eq!(
            generated.body["result"]["summary"]["variables"], 3,
            "{generated:?}"
        );
    }
    let problem = first.body["result"]["problemId"].as_str().unwrap();
    let solved = call_tool(
        &container.base,
        "solve_mip_problem",
        "one",
        json!({"problemId": problem}),
    )
    .await;
    assert_eq!(solved.status.as_u16(), 200, "{solved:?}");
    assert_eq!(solved.body["result"]["status"], "optimal", "{solved:?}");
    assert_eq!(solved.body["result"]["objectiveValue"], 109.0, "{solved:?}");

    let (_, code) = container.stop().await;
    assert_eq!(code, 0, "{}", container.logs().await);
}

#[tokio::test]
#[ignore = "needs the image: scripts/test.sh builds it (scripts/image.sh) and runs these"]
async fn without_the_flags_the_mip_tools_say_sandbox_unavailable_and_the_rest_works() {
    let container = Container::start(&[], &[]).await;
    let logs = container.logs_with("the MIP sandbox is unavailable").await;
    assert!(
        logs.contains("the MIP sandbox is unavailable") && logs.contains("proc"),
        "{logs}"
    );
    let generated = call_tool(
        &container.base,
        "generate_mip_problem",
        "one",
        json!({"problemDefinitionCode": BAKERY}),
    )
    .await;
    assert_eq!(generated.body["success"], false, "{generated:?}");
    assert_eq!(
        generated.body["error"]["code"], "SANDBOX_UNAVAILABLE",
        "{generated:?}"
    );
    assert!(
        generated.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("was not run"),
        "{generated:?}"
    );
    // Everything else: a tab's call, and a built-in tool that runs no code.
    a_call_goes_through(&container.base, &ws_base(&container), None).await;
    let encoded = call_tool(
        &container.base,
        "encodePlantUML",
        "one",
        json!({"plantumlCode": "@startuml\nBob -> Alice : hello\n@enduml"}),
    )
    .await;
    assert_eq!(encoded.status.as_u16(), 200, "{encoded:?}");
    assert_eq!(
        encoded.body["result"]["encoded"],
        "SoWkIImgAStDuNBAJrBGjLDmpCbCJbMmKiX8pSd9vt98pKifpSq10000",
        "{encoded:?}"
    );
}
