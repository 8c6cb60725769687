//! Which client address the brute-force guard keys on: in split mode the relay keys on the
//! client address a gateway passes only with the gateway secret, and on the peer itself
//! otherwise; an IPv6 client is one client per /64 and per /48 in every budget, and a
//! dual-stack listener keys an IPv4 client as IPv4.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::num::NonZeroU32;

use reqwest::StatusCode;
use tonic::transport::Channel;
use toolrelay::proto::v1::{self as pb, relay_client::RelayClient};
use toolrelay_gateway::config::ENV_TRUSTED_PROXIES;
use toolrelay_relay::RelayConfig;
use toolrelay_relay::access::GatewaySecrets;
use toolrelay_relay::config::{ENV_GATEWAY_SECRET, ENV_RATE_LIMIT_LOOKUP};
use toolrelay_tests::guard::{lookups, unknown};
use toolrelay_tests::metrics::Scrape;
use toolrelay_tests::system::{System, send};
use toolrelay_tests::{error_name, relay_client};

/// Misses `n` unknown codes over REST as the client `address` (forwarded by a trusted proxy).
async fn miss_as(system: &System, address: &str, n: usize) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for i in 0..n {
        let request = system
            .http
            .get(system.url(&format!("/api/sessions/{}/metadata", unknown(i))))
            .header("x-forwarded-for", address);
        statuses.push(send(request).await.status);
    }
    statuses
}

#[tokio::test]
async fn in_split_mode_the_relay_keys_on_the_client_a_proven_gateway_names() {
    // The split system's relay and gateway share a gateway secret.
    let system = System::split_with(
        &[(ENV_RATE_LIMIT_LOOKUP, "3")],
        &[(ENV_TRUSTED_PROXIES, "127.0.0.1")],
    )
    .await;
    let statuses = miss_as(&system, "198.51.100.1", 4).await;
    assert_eq!(
        statuses,
        [
            StatusCode::NOT_FOUND,
            StatusCode::NOT_FOUND,
            StatusCode::NOT_FOUND,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // Another client behind the same gateway has its own budget.
    let statuses = miss_as(&system, "198.51.100.2", 1).await;
    assert_eq!(statuses, [StatusCode::NOT_FOUND]);
    system.stop().await;

    // A gateway without the relay's secret (here a wrong one) is not believed: the relay keys
    // on the gateway, so its clients share one budget; and a client address a peer names
    // without the secret counts for nothing.
    let system = System::split_with(
        &[(ENV_RATE_LIMIT_LOOKUP, "3")],
        &[
            (ENV_TRUSTED_PROXIES, "127.0.0.1"),
            (ENV_GATEWAY_SECRET, "not-the-relays-secret-0123456789"),
        ],
    )
    .await;
    miss_as(&system, "198.51.100.1", 3).await;
    let statuses = miss_as(&system, "198.51.100.2", 1).await;
    assert_eq!(statuses, [StatusCode::TOO_MANY_REQUESTS]);
    let mut client = relay_client(system.grpc).await;
    let forged = probe_as(&mut client, 0, "203.0.113.77", None).await;
    assert_eq!(
        forged, "rate_limited",
        "the forged address is ignored: the peer (loopback) is blocked"
    );
    system.stop().await;
}

const SECRET: &str = "guard-gateway-secret-0123456789";
const NEXT: &str = "guard-gateway-secret-next-0123456789";

/// The error name of a `GetSession` of unknown code `n` over gRPC, naming the client `named`
/// and, when given, proving itself a gateway with `proof`.
async fn probe_as(
    client: &mut RelayClient<Channel>,
    n: usize,
    named: &str,
    proof: Option<&str>,
) -> String {
    let mut request = tonic::Request::new(pb::GetSessionRequest { code: unknown(n) });
    let metadata = request.metadata_mut();
    metadata.insert("x-toolrelay-client", named.parse().unwrap());
    if let Some(proof) = proof {
        metadata.insert("x-toolrelay-gateway", proof.parse().unwrap());
    }
    error_name(&client.get_session(request).await.unwrap_err())
}

/// A peer of the gRPC port picks the address the guard sees only with a gateway secret: with
/// either secret of the list (rotation) the address it names is believed; without one, or
/// with a wrong one, naming a fresh address on every probe buys nothing, the peer itself is
/// blocked after its budget, and each such claim is counted as a `gateway_proof` refusal.
#[tokio::test]
async fn a_grpc_peer_names_the_client_only_with_a_gateway_secret() {
    let config = RelayConfig {
        gateway_secrets: GatewaySecrets::load(&[NEXT.to_owned(), SECRET.to_owned()], None).unwrap(),
        ..lookups(3)
    };
    let system = System::with(config, |_| {}).await;
    let mut client = relay_client(system.grpc).await;

    // Proven (with the second secret of the list): the named client spends its own budget.
    let mut names = Vec::new();
    for n in 0..4 {
        names.push(probe_as(&mut client, n, "203.0.113.1", Some(SECRET)).await);
    }
    assert_eq!(
        names,
        [
            "session_not_found",
            "session_not_found",
            "session_not_found",
            "rate_limited"
        ]
    );
    // The first secret of the list is believed too: another client has its own budget, the
    // blocked one stays blocked.
    let other = probe_as(&mut client, 4, "203.0.113.2", Some(NEXT)).await;
    assert_eq!(other, "session_not_found");
    let blocked = probe_as(&mut client, 5, "203.0.113.1", Some(NEXT)).await;
    assert_eq!(blocked, "rate_limited");

    // A wrong secret, then none: a fresh address per probe, and still the peer is blocked.
    let mut names = Vec::new();
    for n in 0..4 {
        let named = format!("198.51.100.{n}");
        names.push(probe_as(&mut client, n, &named, Some("a-wrong-secret-0123456789")).await);
    }
    assert_eq!(
        names,
        [
            "session_not_found",
            "session_not_found",
            "session_not_found",
            "rate_limited"
        ]
    );
    let unproven = probe_as(&mut client, 4, "198.51.100.9", None).await;
    assert_eq!(unproven, "rate_limited");

    let scrape = Scrape::fetch(&system.http, &system.url("/metrics")).await;
    let refused = scrape.value("toolrelay_refused_total", &[("reason", "gateway_proof")]);
    assert!(refused >= 5.0, "gateway_proof refusals counted: {refused}");
    system.stop().await;
}

/// Misses `n` unknown codes over REST as the clients `addresses` name (one each, in turn,
/// forwarded by a trusted proxy).
async fn miss_from(system: &System, addresses: &[&str]) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for (i, address) in addresses.iter().enumerate() {
        let request = system
            .http
            .get(system.url(&format!("/api/sessions/{}/metadata", unknown(i))))
            .header("x-forwarded-for", *address);
        statuses.push(send(request).await.status);
    }
    statuses
}

#[tokio::test]
async fn ipv6_clients_are_one_client_per_64_and_per_48_in_every_budget() {
    let system = System::with(lookups(3), |config| {
        config.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        config.limits.sessions_per_ip = NonZeroU32::new(2).unwrap();
    })
    .await;
    // A fresh address of one /64 for every guess: one budget all the same.
    let statuses = miss_from(
        &system,
        &["2001:db8::1", "2001:db8::2", "2001:db8::3", "2001:db8::4"],
    )
    .await;
    use StatusCode as S;
    assert_eq!(
        statuses,
        [
            S::NOT_FOUND,
            S::NOT_FOUND,
            S::NOT_FOUND,
            S::TOO_MANY_REQUESTS
        ]
    );
    let statuses = miss_from(&system, &["2001:db8::ffff:1"]).await;
    assert_eq!(statuses, [S::TOO_MANY_REQUESTS], "the whole /64 is blocked");
    // Another /64 of the same site (/48) shares the site's ceiling; another site is another
    // client.
    let statuses = miss_from(&system, &["2001:db8:0:1::1"]).await;
    assert_eq!(
        statuses,
        [S::TOO_MANY_REQUESTS],
        "the site's /48 is blocked too"
    );
    let statuses = miss_from(&system, &["2001:db8:1::1"]).await;
    assert_eq!(statuses, [S::NOT_FOUND]);

    // The gateway's budgets too: sessions created per /64.
    let create = |address: &'static str| {
        send(
            system
                .http
                .post(system.url("/api/sessions"))
                .header("x-forwarded-for", address),
        )
    };
    assert_eq!(create("2001:db8:2:2::a").await.status, S::CREATED);
    assert_eq!(create("2001:db8:2:2::b").await.status, S::CREATED);
    assert_eq!(create("2001:db8:2:2::c").await.status, S::TOO_MANY_REQUESTS);
    // Sessions count per /48 as well, so a site's other /64s share its ceiling, and another
    // site has its own.
    assert_eq!(create("2001:db8:2:3::c").await.status, S::TOO_MANY_REQUESTS);
    assert_eq!(create("2001:db8:3:3::c").await.status, S::CREATED);
    system.stop().await;
}

#[tokio::test]
async fn a_real_ipv6_listener_keys_its_clients_apart_from_ipv4_ones() {
    let public = tokio::net::TcpListener::bind("[::1]:0").await.unwrap();
    let system = System::listening(lookups(2), public, |_| {}).await;
    assert!(system.base.starts_with("http://[::1]:"), "{}", system.base);
    let statuses = miss_from(&system, &["", "", ""]).await;
    use StatusCode as S;
    assert_eq!(statuses, [S::NOT_FOUND, S::NOT_FOUND, S::TOO_MANY_REQUESTS]);
    // An IPv4 client (the relay's gRPC port, on 127.0.0.1) has its own budget.
    let mut client = relay_client(system.grpc).await;
    let status = client
        .get_session(pb::GetSessionRequest { code: unknown(9) })
        .await
        .unwrap_err();
    assert_eq!(error_name(&status), "session_not_found");
    system.stop().await;
}

#[tokio::test]
async fn a_dual_stack_listener_keys_an_ipv4_client_as_ipv4() {
    let public = tokio::net::TcpListener::bind("[::]:0").await.unwrap();
    let port = public.local_addr().unwrap().port();
    let mut system = System::listening(lookups(2), public, |_| {}).await;
    // Reached over IPv4: the gateway sees ::ffff:127.0.0.1.
    system.base = format!("http://127.0.0.1:{port}");
    let statuses = miss_from(&system, &["", "", ""]).await;
    use StatusCode as S;
    assert_eq!(statuses, [S::NOT_FOUND, S::NOT_FOUND, S::TOO_MANY_REQUESTS]);
    // The same client on the relay's IPv4 gRPC port is the same budget: blocked.
    let mut client = relay_client(system.grpc).await;
    let status = client
        .get_session(pb::GetSessionRequest { code: unknown(9) })
        .await
        .unwrap_err();
    assert_eq!(error_name(&status), "rate_limited");
    system.stop().await;
}
