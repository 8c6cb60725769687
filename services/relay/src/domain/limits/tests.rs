//! The limits' unit tests: budgets per caller and address, the guard, secrets and codes.
use super::*;

#[test]
fn clients_are_keyed_by_ipv4_address_or_ipv6_prefix() {
    let key = |text: &str, prefix| client_key(text.parse().unwrap(), prefix).to_string();
    assert_eq!(key("127.0.0.1", 64), "127.0.0.1");
    assert_eq!(key("::ffff:127.0.0.1", 64), "127.0.0.1");
    assert_eq!(key("2001:db8::1", 64), "2001:db8::");
    assert_eq!(key("2001:db8::2", 64), "2001:db8::");
    assert_eq!(key("2001:db8:0:1::2", 64), "2001:db8:0:1::");
    assert_eq!(key("2001:db8::1", 128), "2001:db8::1");
    assert_eq!(key("2001:db8::1", 0), "::");
    assert_eq!(key("::1", 64), "::");
}

#[test]
fn trusted_peers_are_addresses_or_networks() {
    let bare = parse_network("10.1.2.3").unwrap();
    assert!(is_within(&[bare], "10.1.2.3".parse().unwrap()));
    assert!(!is_within(&[bare], "10.1.2.4".parse().unwrap()));
    let network = parse_network(" 10.1.0.0/16").unwrap();
    assert!(is_within(&[network], "10.1.2.4".parse().unwrap()));
    assert!(is_within(
        &[parse_network("::1").unwrap()],
        "::1".parse().unwrap()
    ));
    let error = parse_network("gateway.local").unwrap_err();
    assert!(error.contains("CIDR"), "{error}");
}

/// Limits where a caller has `n` of each budget and an address `ceiling`.
fn limits_with(n: u32, ceiling: u32) -> Limits {
    let n = NonZeroU32::new(n).unwrap();
    let ceiling = NonZeroU32::new(ceiling).unwrap();
    let clock = Clock::new();
    Limits::new(
        RateLimits {
            lookups_per_caller: n,
            lookups_per_ip: ceiling,
            calls_per_code: n,
            sessions_per_caller: n,
            sessions_per_ip: ceiling,
            tools_per_caller: n,
            tools_per_ip: ceiling,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        },
        None,
        crate::store::memory::MemoryStore::new(clock.clone(), Duration::from_secs(60)),
        clock,
        Metrics::default(),
    )
}

/// Limits where the callers and addresses have `n` of each budget.
fn limits(n: u32) -> Limits {
    limits_with(n, n)
}

fn name(result: Result<(), RelayError>) -> Option<&'static str> {
    result.err().map(|error| error.name())
}

#[tokio::test]
async fn only_a_client_that_reached_the_relay_itself_is_asked_for_a_key_and_charged() {
    let key = "0123456789abcdef0123";
    let keys = crate::access::ApiKeys::load(&[key.to_owned()], None).unwrap();
    let limits = Limits {
        api_keys: keys,
        ..limits(1)
    };
    let address = "192.0.2.5".parse().unwrap();
    assert_eq!(
        name(limits.admit(&Caller::direct(address, None))),
        Some("api_key_required")
    );
    let wrong = Caller::direct(address, Some("fedcba9876543210fedc".into()));
    assert_eq!(name(limits.admit(&wrong)), Some("invalid_api_key"));
    let keyed = Caller::direct(address, Some(key.into()));
    assert_eq!(name(limits.admit(&keyed)), None);
    let admitted = Caller::new(address);
    assert_eq!(name(limits.admit(&admitted)), None);
    assert!(!format!("{keyed:?}").contains(key), "{keyed:?}");

    // A gateway's clients were charged by the gateway; a direct client pays here.
    for _ in 0..3 {
        limits.admit_session(&admitted).await.unwrap();
        limits.admit_tool_call(&admitted).await.unwrap();
    }
    limits.admit_session(&keyed).await.unwrap();
    assert_eq!(
        name(limits.admit_session(&keyed).await),
        Some("rate_limited")
    );
    limits.admit_tool_call(&keyed).await.unwrap();
    assert_eq!(
        name(limits.admit_tool_call(&keyed).await),
        Some("rate_limited")
    );
}

fn caller(address: &str) -> Caller {
    Caller::new(address.parse().unwrap())
}

fn person(address: &str, who: &str) -> Caller {
    caller(address).with_identity(Some(CallerId::of(IdentityKind::McpSession, who)))
}

async fn lookup(limits: &Limits, who: &Caller, found: bool) -> Result<(), RelayError> {
    limits
        .guarded(who, async {
            if found {
                Ok(())
            } else {
                Err(RelayError::SessionNotFound {
                    code: "ABCD-EFGH".into(),
                })
            }
        })
        .await
}

#[tokio::test]
async fn too_many_unknown_codes_block_every_lookup_of_that_caller() {
    let limits = limits(2);
    let probe = caller("192.0.2.5");
    for _ in 0..2 {
        let error = lookup(&limits, &probe, false).await.unwrap_err();
        assert_eq!(error.name(), "session_not_found");
    }
    let over = lookup(&limits, &probe, false).await.unwrap_err();
    assert_eq!(over.name(), "rate_limited", "the third miss is over budget");
    let known = lookup(&limits, &probe, true).await.unwrap_err();
    assert_eq!(known.name(), "rate_limited", "even a good code is refused");
    assert!(known.retry_after().unwrap() >= Duration::from_secs(1));
    lookup(&limits, &caller("192.0.2.6"), true).await.unwrap();
}

#[tokio::test]
async fn one_guesser_never_locks_out_the_others_behind_its_address() {
    let limits = limits_with(2, 5);
    let guesser = person("192.0.2.5", "guesser");
    let honest = person("192.0.2.5", "honest");
    for _ in 0..2 {
        lookup(&limits, &guesser, false).await.unwrap_err();
    }
    let over = lookup(&limits, &guesser, false).await.unwrap_err();
    assert_eq!(over.name(), "rate_limited");
    // Blocked, the guesser's look-ups are refused before they are made or counted.
    for _ in 0..20 {
        assert_eq!(
            name(lookup(&limits, &guesser, true).await),
            Some("rate_limited")
        );
    }
    // Everyone else at the address goes on, their own typos included.
    lookup(&limits, &honest, true).await.unwrap();
    let typo = lookup(&limits, &honest, false).await.unwrap_err();
    assert_eq!(typo.name(), "session_not_found");
    lookup(&limits, &honest, true).await.unwrap();
    // The address as a whole (no identity) has the ceiling's room left: 5 - 3 misses.
    lookup(&limits, &caller("192.0.2.5"), true).await.unwrap();
}

#[tokio::test]
async fn many_guessers_reach_the_ceiling_which_refuses_codes_but_not_secrets() {
    let limits = limits_with(30, 4);
    // Four identities, one unknown code each: the address's ceiling is spent.
    for who in ["a", "b", "c", "d"] {
        let miss = lookup(&limits, &person("192.0.2.5", who), false).await;
        assert_eq!(name(miss), Some("session_not_found"));
    }
    let fifth = lookup(&limits, &person("192.0.2.5", "e"), false).await;
    assert_eq!(name(fifth), Some("rate_limited"));
    // Now a code is refused to anyone at the address, a valid one too …
    let honest = person("192.0.2.5", "honest");
    assert_eq!(
        name(lookup(&limits, &honest, true).await),
        Some("rate_limited")
    );
    // … but a handle or claim (128-bit secrets) still opens for a caller of its own.
    let secret = limits.guarded_as(&honest, Reference::Secret, async { Ok(()) });
    assert_eq!(name(secret.await), None);
    // So does a claim redeemed by a page with no identity (the plugin at a school).
    let anonymous = caller("192.0.2.5");
    let secret = limits.guarded_as(&anonymous, Reference::Secret, async { Ok(()) });
    assert_eq!(name(secret.await), None);
    // The guesser blocked by its own identity is refused even a secret.
    let strict = limits_with(2, 100);
    let own = person("192.0.2.7", "g");
    for _ in 0..3 {
        let _ = lookup(&strict, &own, false).await;
    }
    let refused = strict.guarded_as(&own, Reference::Secret, async { Ok(()) });
    assert_eq!(name(refused.await), Some("rate_limited"));
    // Another address is untouched.
    lookup(&limits, &person("192.0.2.6", "a"), true)
        .await
        .unwrap();
}

#[tokio::test]
async fn sessions_and_tool_calls_count_per_caller_under_the_address_ceiling() {
    let limits = limits_with(2, 5);
    let budgets = &limits.front_door;
    let (first, second) = (person("192.0.2.5", "1"), person("192.0.2.5", "2"));
    for _ in 0..2 {
        budgets.create_session(&first).await.unwrap();
        budgets.tool_call(&first).await.unwrap();
    }
    assert_eq!(
        name(budgets.create_session(&first).await),
        Some("rate_limited")
    );
    assert_eq!(name(budgets.tool_call(&first).await), Some("rate_limited"));
    // Another caller at the address has its own budget, up to the ceiling (5).
    for _ in 0..2 {
        budgets.create_session(&second).await.unwrap();
    }
    let third = person("192.0.2.5", "3");
    budgets.create_session(&third).await.unwrap();
    assert_eq!(
        name(budgets.create_session(&third).await),
        Some("rate_limited")
    );
}

#[tokio::test]
async fn ipv6_guesses_count_per_64_and_per_48() {
    let limits = limits_with(30, 2);
    // Two /64s of one site spend the site's ceiling: a third /64 of it is refused codes.
    lookup(&limits, &caller("2001:db8:0:1::1"), false)
        .await
        .unwrap_err();
    lookup(&limits, &caller("2001:db8:0:2::1"), false)
        .await
        .unwrap_err();
    let third = lookup(&limits, &caller("2001:db8:0:3::1"), false).await;
    assert_eq!(name(third), Some("rate_limited"));
    let valid = lookup(&limits, &caller("2001:db8:0:4::1"), true).await;
    assert_eq!(
        name(valid),
        Some("rate_limited"),
        "the whole /48 is blocked"
    );
    lookup(&limits, &caller("2001:db8:1::1"), true)
        .await
        .unwrap();
}

#[tokio::test]
async fn ipv6_sessions_count_per_64_and_per_48() {
    let limits = limits_with(100, 2);
    let budgets = &limits.front_door;
    budgets
        .create_session(&caller("2001:db8:0:1::1"))
        .await
        .unwrap();
    budgets
        .create_session(&caller("2001:db8:0:2::1"))
        .await
        .unwrap();
    // A third /64 of the same /48 finds the site's ceiling spent.
    let third = budgets.create_session(&caller("2001:db8:0:3::1")).await;
    assert_eq!(name(third), Some("rate_limited"));
    budgets
        .create_session(&caller("2001:db8:1::1"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_provider_with_its_token_is_never_refused_and_a_wrong_token_learns_nothing() {
    let limits = limits(1);
    let tab = caller("2001:db8::5");
    let not_found = || async {
        Err::<(), _>(RelayError::SessionNotFound {
            code: "ABCD-EFGH".into(),
        })
    };
    // A wrong token on an unknown code counts like any guess.
    let miss = limits.guarded_provider(&tab, Some("t"), not_found()).await;
    assert_eq!(miss.unwrap_err().name(), "session_not_found");
    let over = limits.guarded_provider(&tab, Some("t"), not_found()).await;
    assert_eq!(over.unwrap_err().name(), "rate_limited");
    // Blocked (its whole /64): the proven token is served, anything unproven refused alike.
    let other = caller("2001:db8::6");
    assert!(
        limits
            .guarded_provider(&other, Some("t"), async { Ok(()) })
            .await
            .is_ok()
    );
    let wrong = async {
        Err::<(), _>(RelayError::InvalidToken {
            code: "ABCD-EFGH".into(),
        })
    };
    let refused = limits.guarded_provider(&other, Some("t"), wrong).await;
    assert_eq!(refused.unwrap_err().name(), "rate_limited");
    let without = limits
        .guarded_provider(&other, None, async { Ok(()) })
        .await;
    assert_eq!(without.unwrap_err().name(), "rate_limited");
}

#[tokio::test]
async fn calls_are_counted_per_caller_and_session_whatever_the_spelling() {
    let limits = limits(2);
    let who = caller("192.0.2.5");
    limits.call(&who, "ABCD-EFGH").await.unwrap();
    limits.call(&who, "abcdefgh").await.unwrap();
    assert_eq!(
        limits.call(&who, "ABCDEFGH").await.unwrap_err().name(),
        "rate_limited"
    );
    limits.call(&who, "ZZZZZZZZ").await.unwrap();
    limits.call(&caller("192.0.2.6"), "ABCDEFGH").await.unwrap();
    // Another caller at the same address has a budget of its own.
    limits
        .call(&person("192.0.2.5", "other"), "ABCDEFGH")
        .await
        .unwrap();
}
