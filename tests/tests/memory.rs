//! Memory that an operator can bound: an idle tab's WebSocket costs a few kilobytes, not the
//! 128 KiB buffers tungstenite reserves by default. Measured on the real binary's RSS.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use toolrelay_tests::WsTab;
use toolrelay_tests::system::System;

/// The resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap()
}

#[tokio::test]
async fn an_idle_tab_costs_a_few_kilobytes() {
    const TABS: usize = 300;
    let system = System::binary(&[("RATE_LIMIT_SESSION_PER_IP", "100000")]).await;
    let pid = system.pid().unwrap();
    // Sessions first, so what is measured is the sockets.
    let mut sessions = Vec::new();
    for _ in 0..TABS {
        sessions.push(system.create_session().await);
    }
    // One tab to warm the code paths up.
    let warm = WsTab::attach_url(&system.ws_url(&sessions[0].0, &sessions[0].1)).await;
    let before = rss_kib(pid);
    let mut tabs = vec![warm];
    for (code, token) in &sessions[1..] {
        tabs.push(WsTab::attach_url(&system.ws_url(code, token)).await);
    }
    let per_tab = (rss_kib(pid).saturating_sub(before)) as f64 / (TABS - 1) as f64;
    println!("{per_tab:.1} KiB per idle WebSocket tab");
    assert!(per_tab < 40.0, "{per_tab:.1} KiB per idle tab");
    drop(tabs);
}
