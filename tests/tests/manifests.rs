//! The Kubernetes manifests (`k8s/`), offline: every kustomization renders with the pinned
//! `kubectl`, every object validates strictly against the Kubernetes schemas and, for the
//! ServiceMonitor and PrometheusRule, prometheus-operator's; the alerts pass `promtool check
//! rules` and their unit tests; and the Deployments give each binary only settings it takes,
//! with the probes (a startupProbe before the liveness probe) and drain timing an operator
//! relies on. (`kube_play.rs` runs them.)

use std::collections::BTreeSet;

use serde_json::Value;
use toolrelay_tests::deploy::{manifests, render, scratch};
use toolrelay_tests::repo_file;
use toolrelay_tests::system::binary;

/// What `scripts/test.sh` checks: the base (and its part without Redis), the overlay to adapt,
/// the one podman runs, and the ones on a Redis outside the cluster (managed with TLS;
/// Sentinel).
const KUSTOMIZATIONS: [&str; 6] = [
    "base",
    "base/app",
    "overlays/production",
    "overlays/podman",
    "overlays/managed-redis-tls",
    "overlays/sentinel",
];
/// The oldest Kubernetes the sandbox component asks for (user namespaces and unmasked /proc
/// on by default), and the newest kubernetes-validate carries.
const KUBERNETES: [&str; 2] = ["1.33.0", "1.37.0"];

fn stdout(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test]
async fn every_kustomization_renders_and_every_object_validates_offline() {
    let dir = scratch("manifests-validate");
    let versions = KUBERNETES.join(",");
    let mut args = vec!["validate".to_owned(), versions];
    for kustomization in KUSTOMIZATIONS {
        let file = render(kustomization, &dir).await;
        args.push(file.to_str().unwrap().to_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let checked = manifests(&args).await;
    let said = stdout(&checked);
    assert!(checked.status.success(), "{said}");
    for kustomization in KUSTOMIZATIONS {
        let file = format!("{}.yaml", kustomization.replace('/', "-"));
        let suffix = if kustomization == "overlays/podman" {
            "-a"
        } else {
            ""
        };
        for deployment in ["toolrelay-relay", "toolrelay-gateway"] {
            let line = format!("ok {file} Deployment/{deployment}{suffix} ");
            assert!(said.contains(&line), "no {line:?} in:\n{said}");
        }
        if kustomization != "overlays/podman" {
            for custom in ["ServiceMonitor/toolrelay", "PrometheusRule/toolrelay"] {
                let line = format!("ok {file} {custom} (prometheus-operator schema)");
                assert!(said.contains(&line), "no {line:?} in:\n{said}");
            }
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// The validation is not a formality: a misspelt field of a built-in kind and of a custom
/// resource each fail it.
#[tokio::test]
async fn the_validation_refuses_misspelt_fields() {
    let dir = scratch("manifests-misspelt");
    let file = render("overlays/production", &dir).await;
    let yaml = std::fs::read_to_string(&file).unwrap();
    // `port: ws` is a probe's port in the relay's Deployment and an endpoint's port in the
    // ServiceMonitor.
    assert!(yaml.contains("port: ws"));
    let broken = dir.join("broken.yaml");
    std::fs::write(&broken, yaml.replace("port: ws", "prot: ws")).unwrap();
    let checked = manifests(&["validate", KUBERNETES[1], broken.to_str().unwrap()]).await;
    let said = stdout(&checked);
    assert!(!checked.status.success(), "{said}");
    assert!(
        said.contains("FAIL broken.yaml Deployment/toolrelay-relay"),
        "{said}"
    );
    assert!(
        said.contains("FAIL broken.yaml ServiceMonitor/toolrelay") && said.contains("prot"),
        "{said}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn the_alerts_pass_promtool_and_each_has_a_firing_and_a_quiet_unit_test() {
    let dir = scratch("manifests-alerts");
    let file = render("base", &dir).await;
    let rules = dir.join("alerts.rules.yaml");
    let extracted = manifests(&["rules", file.to_str().unwrap(), rules.to_str().unwrap()]).await;
    assert!(extracted.status.success(), "{}", stdout(&extracted));
    let tests = std::fs::read_to_string(repo_file("k8s/tests/alerts.test.yaml")).unwrap();
    std::fs::write(dir.join("alerts.test.yaml"), &tests).unwrap();

    let checked = tokio::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .await
        .expect("promtool (Debian's prometheus package; scripts/setup.sh --test installs it)");
    assert!(checked.status.success(), "{}", stdout(&checked));
    let tested = tokio::process::Command::new("promtool")
        .args(["test", "rules", "alerts.test.yaml"])
        .current_dir(&dir)
        .output()
        .await
        .unwrap();
    assert!(tested.status.success(), "{}", stdout(&tested));
    assert!(stdout(&tested).contains("SUCCESS"), "{}", stdout(&tested));

    // Every alert is expected to fire in some case and to stay quiet in another.
    let alerts: BTreeSet<String> = std::fs::read_to_string(&rules)
        .unwrap()
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect();
    assert!(alerts.len() >= 9, "{alerts:?}");
    for alert in &alerts {
        let cases: Vec<&str> = tests
            .split("alertname: ")
            .skip(1)
            .filter(|case| case.starts_with(&format!("{alert}\n")))
            .collect();
        let quiet = cases.iter().any(|case| {
            case.lines()
                .nth(1)
                .is_some_and(|line| line.trim() == "exp_alerts: []")
        });
        let firing = cases.iter().any(|case| {
            case.lines()
                .nth(1)
                .is_some_and(|line| line.trim() == "exp_alerts:")
        });
        assert!(quiet && firing, "{alert}: quiet {quiet}, firing {firing}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// The environment variables a binary takes: `[env: NAME=…]` in its `--help`.
async fn variables_of(binary_name: &str) -> BTreeSet<String> {
    let help = tokio::process::Command::new(binary(binary_name))
        .arg("--help")
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&help.stdout)
        .split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split(['=', ']']).next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_deployments_give_each_binary_only_settings_it_takes_and_drain_in_time() {
    let dir = scratch("manifests-facts");
    for kustomization in [
        "overlays/production",
        "overlays/podman",
        "overlays/managed-redis-tls",
        "overlays/sentinel",
    ] {
        let file = render(kustomization, &dir).await;
        let facts = manifests(&["facts", file.to_str().unwrap()]).await;
        assert!(facts.status.success(), "{}", stdout(&facts));
        let facts: Value = serde_json::from_slice(&facts.stdout).unwrap();
        let drain: u64 = facts["data"]["ConfigMap/toolrelay"]["DRAIN_SECONDS"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let mut binaries = BTreeSet::new();
        for workload in facts["workloads"].as_array().unwrap() {
            for container in workload["containers"].as_array().unwrap() {
                let Some(command) = container["command"][0].as_str() else {
                    continue;
                };
                if !command.starts_with("toolrelay") {
                    continue;
                }
                binaries.insert(command.to_owned());
                let name = workload["name"].as_str().unwrap();
                let takes = variables_of(command).await;
                for variable in container["env"].as_array().unwrap() {
                    let variable = variable.as_str().unwrap();
                    // RUST_LOG is read by the logging library, not by a flag.
                    assert!(
                        variable == "RUST_LOG" || takes.contains(variable),
                        "{kustomization}: {name} gives {command} {variable}, which it does not take ({takes:?})"
                    );
                }
                assert_eq!(container["readiness"], "/readyz", "{name}");
                assert_eq!(container["liveness"], "/healthz", "{name}");
                // A start that waits for Redis (or a slow node) is not killed by the liveness
                // probe: the startup probe holds it off for at least a minute.
                assert_eq!(container["startup"], "/healthz", "{name}");
                let startup = container["startup_seconds"].as_u64().unwrap();
                assert!(
                    startup >= 60,
                    "{name}: the startupProbe allows only {startup} s"
                );
                let grace = workload["grace"].as_u64().unwrap();
                let pre_stop = container["pre_stop_sleep"].as_u64().unwrap();
                assert!(
                    grace > pre_stop + drain,
                    "{name}: terminationGracePeriodSeconds {grace} must outlast preStop {pre_stop} s + DRAIN_SECONDS {drain}"
                );
                if kustomization != "overlays/podman" {
                    assert!(workload["replicas"].as_u64().unwrap() >= 2, "{name}");
                }
            }
        }
        assert_eq!(
            binaries.into_iter().collect::<Vec<_>>(),
            ["toolrelay-gateway", "toolrelay-relay"],
            "{kustomization}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// kustomize 5.5.0 (kubectl 1.32) panics on a patch that deletes a whole object (a document
/// whose top level says `$patch: delete`): no manifest has one, so that the oldest kubectl the
/// README names still renders every directory. (Deleting an item of a list stays fine.)
#[test]
fn no_manifest_deletes_a_whole_object() {
    fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "yaml") {
                let text = std::fs::read_to_string(&path).unwrap();
                if text.lines().any(|line| line.trim_end() == "$patch: delete") {
                    found.push(path.display().to_string());
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(&repo_file("k8s"), &mut found);
    assert!(found.is_empty(), "whole-object deletions in {found:?}");
}
