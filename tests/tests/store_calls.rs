//! The store conformance suite's cases on calls, run against every store (the memory store,
//! the Redis store on a `redis-server`, on a Redis Cluster node and on a Redis Cluster;
//! `toolrelay_tests::store_fixture`): enqueueing, claims and leases, the hand-over to a pushing
//! tab, answers and who may give them, built-in calls, deadlines, retention, and the answer
//! budgets' eviction. The cases on what a session holds are in `store_conformance.rs`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use toolrelay::wire::{RequestStatus, ToolResponse};
use toolrelay_relay::store::{
    Answerer, BUILTIN_LEASE, EnqueueChecks, Enqueued, Finished, RateBudget, RateCharge,
    SessionEvent, Transport,
};
use toolrelay_relay::{SessionCode, Timestamp};
use toolrelay_tests::store_fixture::{
    Fixture, HOUR, answer, attached, call, claim, code_of, limits, next_event, provider, session,
    with_session,
};

toolrelay_tests::conformance! {
    async fn enqueue_is_idempotent_by_id_bounded_and_slides_the_expiry(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
        let args = json!({"text": "hi", "n": 12345678901234567890u64, "f": 0.1});
        let until = Timestamp(now.0 + 2 * 3_600_000);
        let Enqueued::Queued(record) =
            fixture.store.enqueue(&code, call("r1", now, args.clone()), 2, until).await.unwrap()
        else {
            panic!("not queued")
        };
        assert_eq!(next_event(&mut events).await, SessionEvent::RequestQueued);
        assert_eq!((record.status, record.args.clone(), record.seq), (RequestStatus::Queued, args.clone(), record.seq));
        assert_eq!(fixture.store.session(&code).await.unwrap().unwrap().expires_at, until);
        // The same id and call: the existing record; the same id, another call: a conflict.
        assert!(matches!(
            fixture.store.enqueue(&code, call("r1", now, args.clone()), 2, now).await.unwrap(),
            Enqueued::Existing(existing) if existing.id == "r1" && existing.args == args
        ));
        assert_eq!(
            fixture.store.enqueue(&code, call("r1", now, json!({"text": "other"})), 2, now).await.unwrap(),
            Enqueued::Conflict("r1".into())
        );
        // Key order does not make another call.
        let reordered: Value = serde_json::from_str(r#"{"f":0.1,"n":12345678901234567890,"text":"hi"}"#).unwrap();
        assert!(matches!(
            fixture.store.enqueue(&code, call("r1", now, reordered), 2, now).await.unwrap(),
            Enqueued::Existing(_)
        ));
        let Enqueued::Queued(second) =
            fixture.store.enqueue(&code, call("r2", now, json!({})), 2, now).await.unwrap()
        else {
            panic!("not queued")
        };
        assert!(second.seq > record.seq);
        assert_eq!(
            fixture.store.enqueue(&code, call("r3", now, json!({})), 2, now).await.unwrap(),
            Enqueued::Full
        );
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(2));
        assert_eq!(fixture.store.request(&code, "r3").await.unwrap(), None);
    }

    async fn claims_go_to_the_provider_only_oldest_first_under_a_lease(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        for id in ["r1", "r2", "r3"] {
            fixture.store.enqueue(&code, call(id, now, json!({"id": id})), 10, now).await.unwrap();
        }
        let mut builtin = call("b1", now, json!({}));
        builtin.builtin = true;
        let Enqueued::Queued(builtin) = fixture.store.enqueue(&code, builtin, 10, now).await.unwrap() else {
            panic!("not queued")
        };
        assert_eq!(builtin.status, RequestStatus::Delivered, "the relay runs a built-in call");
        assert!(fixture.store.claim(&code, &claim("stranger", now, HOUR)).await.unwrap().is_empty());
        let mut two = claim("tab-1", now, Duration::from_secs(30));
        two.limit = 2;
        let claimed = fixture.store.claim(&code, &two).await.unwrap();
        let ids: Vec<_> = claimed.iter().map(|record| record.id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2"]);
        assert!(claimed.iter().all(|record| record.status == RequestStatus::Delivered
            && record.delivered_to.as_deref() == Some("tab-1")
            && record.deliveries == 1
            && record.args["id"] == record.id.as_str()));
        // Under the lease only what is left; after it, everything unanswered again.
        let rest = fixture.store.claim(&code, &claim("tab-1", now, Duration::from_secs(30))).await.unwrap();
        assert_eq!(rest.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r3"]);
        fixture.advance(Duration::from_secs(31));
        let again = fixture.store.claim(&code, &claim("tab-1", fixture.now(), Duration::from_secs(30))).await.unwrap();
        assert_eq!(again.len(), 3);
        assert!(again.iter().all(|record| record.deliveries == 2));
        // A new provider gets what the old one held, at once.
        fixture.store.set_provider(&code, provider("tab-2", fixture.now())).await.unwrap();
        let moved = fixture.store.claim(&code, &claim("tab-2", fixture.now(), HOUR)).await.unwrap();
        assert_eq!(moved.len(), 3);
        assert!(fixture.store.claim(&code, &claim("tab-1", fixture.now(), HOUR)).await.unwrap().is_empty());
    }

    async fn a_redelivering_claim_hands_out_again_what_its_connection_holds(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        for id in ["r1", "r2", "r3"] {
            fixture.store.enqueue(&code, call(id, now, json!({"id": id})), 10, now).await.unwrap();
        }
        let mut one = claim("tab-1", now, HOUR);
        one.limit = 1;
        assert_eq!(fixture.store.claim(&code, &one).await.unwrap().len(), 1);
        let finished = fixture.store.finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)),
            Answerer::Connection("tab-1"), now, now.plus(HOUR)).await.unwrap();
        assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
        let mut two = claim("tab-1", now, HOUR);
        two.limit = 1;
        let held = fixture.store.claim(&code, &two).await.unwrap();
        assert_eq!(held.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r2"]);
        // Under its lease, a plain claim leaves r2 alone; a redelivering one hands it out
        // again with what is queued, never the answered r1.
        let plain = fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap();
        assert_eq!(plain.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r3"]);
        let mut again = claim("tab-1", now, HOUR);
        again.redeliver = true;
        let redelivered = fixture.store.claim(&code, &again).await.unwrap();
        assert_eq!(redelivered.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r2", "r3"]);
        assert!(redelivered.iter().all(|record| record.delivered_to.as_deref() == Some("tab-1")));
        // Only to the session's provider, and never past a call's deadline.
        let mut stranger = claim("stranger", now, HOUR);
        stranger.redeliver = true;
        assert!(fixture.store.claim(&code, &stranger).await.unwrap().is_empty());
        fixture.advance(Duration::from_secs(61));
        let mut late = claim("tab-1", fixture.now(), HOUR);
        late.redeliver = true;
        assert!(fixture.store.claim(&code, &late).await.unwrap().is_empty());
    }

    async fn the_first_answer_wins_and_answers_are_kept_in_queue_order(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        for id in ["r1", "r2"] {
            fixture.store.enqueue(&code, call(id, now, json!({})), 10, now).await.unwrap();
        }
        let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
        let mut waiting_r1 = fixture.store.listen_for_answer(&code, "r1").await.unwrap();
        let mut waiting_r2 = fixture.store.listen_for_answer(&code, "r2").await.unwrap();
        let result = json!({"n": 12345678901234567890u64, "x": 0.30000000000000004, "s": "é\u{0}"});
        let until = Timestamp(now.0 + 2 * 3_600_000);
        let Finished::Finished(record) = fixture
            .store
            .finish(&code, "r2", RequestStatus::Completed, answer("r2", result.clone()), Answerer::Relay, now, until)
            .await
            .unwrap()
        else {
            panic!("not finished")
        };
        // The finished call comes with its waiter's event: a waiter need not read it. The
        // session's stream hears of it too (how it ended: a tab learns of a cancelled call
        // without reading it), with its answer when that is small; a waiter for another call
        // does not.
        assert_eq!(
            next_event(&mut waiting_r2).await,
            SessionEvent::ResponseReady { id: "r2".into(), record: Some(record.clone()) }
        );
        assert_eq!(
            next_event(&mut events).await,
            SessionEvent::ResponseReady { id: "r2".into(), record: Some(record.clone()) }
        );
        assert_eq!(
            futures::FutureExt::now_or_never(waiting_r1.next()),
            None,
            "a waiter woken by another call's answer"
        );
        assert_eq!(record.status, RequestStatus::Completed);
        assert_eq!(record.response.as_ref().unwrap().result, Some(result.clone()));
        assert_eq!(fixture.store.session(&code).await.unwrap().unwrap().expires_at, until);
        assert!(matches!(
            fixture.store.finish(&code, "r2", RequestStatus::Failed, answer("r2", json!(1)), Answerer::Relay, now, now).await.unwrap(),
            Finished::AlreadyFinished(kept) if kept.response.as_ref().unwrap().result == Some(result.clone())
        ));
        assert_eq!(
            fixture.store.finish(&code, "nope", RequestStatus::Completed, answer("nope", json!(1)), Answerer::Relay, now, now).await.unwrap(),
            Finished::NoRequest
        );
        // A large answer is not on the stream: what a slow stream has not read holds little.
        let large = json!("x".repeat(5000));
        let Finished::Finished(r1) = fixture.store.finish(&code, "r1", RequestStatus::Completed, answer("r1", large), Answerer::Relay, now, now).await.unwrap() else {
            panic!("r1 not finished")
        };
        assert_eq!(
            next_event(&mut events).await,
            SessionEvent::ResponseReady { id: "r1".into(), record: Some(std::sync::Arc::new(r1.without_answer())) }
        );
        let responses = fixture.store.responses(&code, None).await.unwrap().unwrap();
        assert_eq!(responses.iter().map(|r| r.request_id.as_str()).collect::<Vec<_>>(), ["r1", "r2"]);
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(0));
        // A finished call is never handed out again.
        assert!(fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap().is_empty());
        // Its id still identifies it.
        assert!(matches!(
            fixture.store.enqueue(&code, call("r1", now, json!({})), 10, now).await.unwrap(),
            Enqueued::Existing(existing) if existing.status == RequestStatus::Completed
        ));
    }

    async fn a_finished_call_is_kept_for_the_retention_time_then_gone_and_its_id_free(fixture) {
        let code = with_session(&fixture).await;
        let finished_at = fixture.now();
        fixture.store.enqueue(&code, call("r1", finished_at, json!({})), 10, finished_at).await.unwrap();
        fixture
            .store
            .finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)), Answerer::Relay, finished_at, finished_at)
            .await
            .unwrap();
        // The session lives on (its tab keeps it alive) past the call's retention time.
        let keep_alive = |fixture: &Fixture| {
            let now = fixture.now();
            let store = fixture.store.clone();
            let code = code.clone();
            async move { store.touch_session(&code, now, now.plus(HOUR), None).await.unwrap().unwrap() }
        };
        fixture.advance(HOUR - Duration::from_secs(1));
        keep_alive(&fixture).await;
        assert!(fixture.store.request(&code, "r1").await.unwrap().is_some(), "kept within the retention");
        fixture.advance(Duration::from_secs(1));
        keep_alive(&fixture).await;
        assert!(fixture.store.request(&code, "r1").await.unwrap().is_none(), "gone past the retention");
        assert!(fixture.store.responses(&code, None).await.unwrap().unwrap().is_empty());
        // Its id may name a new call, even a different one.
        let now = fixture.now();
        assert!(matches!(
            fixture.store.enqueue(&code, call("r1", now, json!({"again": true})), 10, now).await.unwrap(),
            Enqueued::Queued(record) if record.status != RequestStatus::Completed
        ));
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(1));
    }

    async fn a_call_past_its_deadline_expires_and_refuses_a_late_answer(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        fixture.store.enqueue(&code, call("r1", now, json!({})), 10, now).await.unwrap();
        fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap();
        fixture.advance(Duration::from_secs(61));
        let later = fixture.now();
        let record = fixture.store.request(&code, "r1").await.unwrap().unwrap();
        assert_eq!(record.status, RequestStatus::Expired);
        assert_eq!(record.response.unwrap().error.unwrap().code, "request_expired");
        assert!(matches!(
            fixture.store.finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)), Answerer::Relay, later, later).await.unwrap(),
            Finished::AlreadyFinished(kept) if kept.status == RequestStatus::Expired
        ));
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(0));
        assert!(fixture.store.claim(&code, &claim("tab-1", later, HOUR)).await.unwrap().is_empty());
    }

    async fn answers_stay_within_their_budget_and_evicted_calls_are_still_known(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        let budget = limits().answer_budget;
        for n in 0..20 {
            let id = format!("r{n}");
            fixture.store.enqueue(&code, call(&id, now, json!({})), 100, now).await.unwrap();
            fixture
                .store
                .finish(&code, &id, RequestStatus::Completed, answer(&id, json!("x".repeat(8 * 1024))), Answerer::Relay, now, now)
                .await
                .unwrap();
            let used = fixture.store.usage().await.unwrap().answer_bytes;
            assert!(used <= budget, "{used} bytes after {n}");
        }
        assert!(fixture.store.usage().await.unwrap().answer_bytes > budget / 2);
        let oldest = fixture.store.request(&code, "r0").await.unwrap().unwrap();
        assert!(oldest.evicted && oldest.response.is_none());
        assert_eq!(oldest.status, RequestStatus::Completed);
        assert!(matches!(
            fixture.store.enqueue(&code, call("r0", now, json!({})), 100, now).await.unwrap(),
            Enqueued::Existing(record) if record.evicted
        ));
        let newest = fixture.store.request(&code, "r19").await.unwrap().unwrap();
        assert!(!newest.evicted && newest.response.is_some());
        // Ending the session gives its bytes back.
        fixture.store.delete_session(&code).await.unwrap();
        assert_eq!(fixture.store.usage().await.unwrap().answer_bytes, 0);
    }

    async fn a_session_over_its_share_of_the_answer_budget_evicts_its_own_oldest_answers(fixture) {
        let now = fixture.now();
        let share = limits().session_answer_budget;
        let quiet = code_of("QUIET234");
        let noisy = code_of("NOISY234");
        for code in [&quiet, &noisy] {
            let record = session(code.as_str(), now, HOUR);
            assert!(fixture.store.insert_session(record).await.unwrap());
        }
        let answered = |code: &SessionCode, id: String, bytes: usize| {
            let store = Arc::clone(&fixture.store);
            let code = code.clone();
            async move {
                store.enqueue(&code, call(&id, now, json!({})), 100, now).await.unwrap();
                let answer = answer(&id, json!("x".repeat(bytes)));
                let finished = store
                    .finish(&code, &id, RequestStatus::Completed, answer, Answerer::Relay, now, now)
                    .await
                    .unwrap();
                assert!(matches!(finished, Finished::Finished(_)), "{finished:?}");
            }
        };
        // A quiet session's two small answers, then a noisy one's flood of larger ones: within
        // the budget it has room for, but over the noisy session's share.
        for n in 0..2 {
            answered(&quiet, format!("q{n}"), 2 * 1024).await;
        }
        let quiet_bytes = fixture.store.usage().await.unwrap().answer_bytes;
        for n in 0..20 {
            answered(&noisy, format!("n{n}"), 8 * 1024).await;
            let noisy_bytes = fixture.store.usage().await.unwrap().answer_bytes - quiet_bytes;
            assert!(noisy_bytes <= share, "the noisy session keeps {noisy_bytes} bytes after {n}");
        }
        // The quiet session lost nothing.
        for n in 0..2 {
            let kept = fixture.store.request(&quiet, &format!("q{n}")).await.unwrap().unwrap();
            assert!(!kept.evicted && kept.response.is_some(), "q{n} was evicted");
        }
        assert_eq!(fixture.store.responses(&quiet, None).await.unwrap().unwrap().len(), 2);
        // The noisy one kept its newest answers, within its share, and lost its oldest.
        let mut evicted = Vec::new();
        for n in 0..20 {
            let record = fixture.store.request(&noisy, &format!("n{n}")).await.unwrap().unwrap();
            assert_eq!(record.status, RequestStatus::Completed);
            evicted.push(record.evicted);
        }
        let kept = evicted.iter().filter(|evicted| !**evicted).count();
        assert!((3..=6).contains(&kept), "{kept} answers kept: {evicted:?}");
        assert!(evicted[..20 - kept].iter().all(|evicted| *evicted), "oldest first: {evicted:?}");
        // Ending the noisy session gives its bytes back, and its share counts from nothing.
        fixture.store.delete_session(&noisy).await.unwrap();
        assert_eq!(fixture.store.usage().await.unwrap().answer_bytes, quiet_bytes);
    }

    async fn a_tab_answers_only_the_calls_delivered_to_it_and_never_a_builtin_one(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        for id in ["r1", "r2", "r3"] {
            fixture.store.enqueue(&code, call(id, now, json!({})), 10, now).await.unwrap();
        }
        let mut builtin = call("b1", now, json!({}));
        builtin.builtin = true;
        fixture.store.enqueue(&code, builtin, 10, now).await.unwrap();
        assert_eq!(fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap().len(), 3);
        fixture.store.enqueue(&code, call("r4", now, json!({})), 10, now).await.unwrap();
        let finish = |id: &'static str, answerer: Answerer<'static>| {
            let store = Arc::clone(&fixture.store);
            let code = code.clone();
            async move {
                let answer = answer(id, json!("forged"));
                store
                    .finish(&code, id, RequestStatus::Completed, answer, answerer, now, now)
                    .await
                    .unwrap()
            }
        };
        // Refused, and nothing changed: a call delivered to another connection, one not
        // delivered yet, and the relay's own call, whoever asks.
        let refused = [
            ("r1", Answerer::Connection("tab-2")),
            ("r4", Answerer::Connection("tab-1")),
            ("r4", Answerer::Provider),
            ("b1", Answerer::Connection("tab-1")),
            ("b1", Answerer::Connection("relay")),
            ("b1", Answerer::Provider),
        ];
        for (id, answerer) in refused {
            assert_eq!(finish(id, answerer).await, Finished::NotDelivered, "{id} by {answerer:?}");
        }
        for (id, status) in [
            ("r1", RequestStatus::Delivered),
            ("r4", RequestStatus::Queued),
            ("b1", RequestStatus::Delivered),
        ] {
            let record = fixture.store.request(&code, id).await.unwrap().unwrap();
            assert_eq!((record.status, record.response), (status, None), "{id}");
        }
        assert_eq!(fixture.store.pending_count(&code).await.unwrap(), Some(5));
        // Accepted: the connection the call was delivered to, and the current provider for
        // the calls delivered to it (an answer posted over HTTP).
        assert!(matches!(finish("r1", Answerer::Connection("tab-1")).await, Finished::Finished(_)));
        assert!(matches!(finish("r2", Answerer::Provider).await, Finished::Finished(_)));
        // A call the next provider took over is its own, no longer the old connection's.
        fixture.store.set_provider(&code, provider("tab-2", now)).await.unwrap();
        assert_eq!(finish("r3", Answerer::Provider).await, Finished::NotDelivered);
        let moved = fixture.store.claim(&code, &claim("tab-2", now, HOUR)).await.unwrap();
        assert_eq!(moved.iter().map(|record| record.id.as_str()).collect::<Vec<_>>(), ["r3", "r4"]);
        assert_eq!(finish("r3", Answerer::Connection("tab-1")).await, Finished::NotDelivered);
        assert!(matches!(finish("r3", Answerer::Connection("tab-2")).await, Finished::Finished(_)));
        // A repeated answer from the right connection is told the call is answered.
        assert!(matches!(finish("r3", Answerer::Provider).await, Finished::AlreadyFinished(_)));
        // The relay answers its own call.
        let Finished::Finished(record) = finish("b1", Answerer::Relay).await else {
            panic!("the relay's answer to its own call was refused")
        };
        assert_eq!(record.response.as_ref().unwrap().result, Some(json!("forged")));
    }

    async fn a_checked_enqueue_spends_the_charge_and_queues_only_at_the_known_manifest(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        let until = Timestamp(now.0 + 2 * 3_600_000);
        assert_eq!(fixture.store.set_manifest(&code, "[]".into()).await.unwrap(), Some(1));
        let charge = RateCharge {
            key: "calls:192.0.2.1:{ABCD2345}".into(),
            budget: RateBudget::per_minute(std::num::NonZeroU32::new(2).unwrap()),
        };
        let checks = |revision| EnqueueChecks { manifest_revision: Some(revision), charge: Some(charge.clone()), ..EnqueueChecks::default() };
        // Checked against revision 0, the manifest moved on: nothing queued, the session told.
        let (stale, session) = fixture
            .store
            .enqueue_checked(&code, call("r1", now, json!({})), 10, until, checks(0))
            .await
            .unwrap();
        // The call is given back whole, to be checked again.
        assert_eq!(stale, Enqueued::StaleManifest(Box::new(call("r1", now, json!({})))));
        let session = session.expect("the session");
        assert_eq!(session.manifest_revision, 1);
        assert_eq!(session.provider.as_ref().unwrap().connection_id, "tab-1");
        assert_eq!(fixture.store.request(&code, "r1").await.unwrap(), None);
        // At the current revision it is queued, with the session as it is after (slid).
        let (queued, session) = fixture
            .store
            .enqueue_checked(&code, call("r1", now, json!({})), 10, until, checks(1))
            .await
            .unwrap();
        assert!(matches!(queued, Enqueued::Queued(ref record) if record.id == "r1"), "{queued:?}");
        assert_eq!(session.unwrap().expires_at, until);
        // Two units a minute, both spent (the stale attempt cost one too): the third waits.
        let (limited, session) = fixture
            .store
            .enqueue_checked(&code, call("r2", now, json!({})), 10, until, checks(1))
            .await
            .unwrap();
        let Enqueued::RateLimited(wait) = limited else { panic!("not limited: {limited:?}") };
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(30), "{wait:?}");
        assert_eq!(session, None);
        assert_eq!(fixture.store.request(&code, "r2").await.unwrap(), None);
        // The budget is the same one `spend` keeps.
        assert!(fixture.store.spend(&charge.key, charge.budget, fixture.now()).await.unwrap().is_some());
        // An unknown session: nothing queued, no session.
        let (none, session) = fixture
            .store
            .enqueue_checked(&code_of("ZZZZ2345"), call("r3", now, json!({})), 10, until, EnqueueChecks::default())
            .await
            .unwrap();
        assert_eq!((none, session), (Enqueued::NoSession, None));
    }

    async fn a_built_in_call_is_leased_to_one_run_and_taken_over_when_the_lease_runs_out(fixture) {
        let code = with_session(&fixture).await;
        let now = fixture.now();
        let mut request = call("b1", now, json!({"plantumlCode": "A -> B"}));
        request.builtin = true;
        let Enqueued::Queued(queued) = fixture.store.enqueue(&code, request, 10, now).await.unwrap()
        else {
            panic!("not queued")
        };
        // Queued, it is held for the relay for one lease, and no tab ever gets it.
        assert_eq!(queued.status, RequestStatus::Delivered);
        assert_eq!(queued.delivered_to.as_deref(), Some("relay"));
        assert_eq!(queued.lease_until, Some(now.plus(BUILTIN_LEASE)));
        assert_eq!(queued.deliveries, 1);
        assert!(!queued.is_orphaned_builtin(now));
        assert!(fixture.store.claim(&code, &claim("tab-1", now, HOUR)).await.unwrap().is_empty());
        let lease = |holder: &'static str, now: Timestamp| {
            fixture.store.lease_builtin(&code, "b1", holder, now, now.plus(BUILTIN_LEASE))
        };
        // The replica that queued it runs it: the first run, not a takeover.
        let run = lease("a/1", now).await.unwrap().expect("leased");
        assert_eq!((run.delivered_to.as_deref(), run.deliveries), (Some("a/1"), 1));
        assert!(lease("b/1", now).await.unwrap().is_none(), "held by a/1");
        // Renewed a third of the way, it holds past the first lease.
        fixture.advance(BUILTIN_LEASE / 3);
        let renewed = lease("a/1", fixture.now()).await.unwrap().expect("renewed");
        assert_eq!((renewed.lease_until, renewed.deliveries), (Some(fixture.now().plus(BUILTIN_LEASE)), 1));
        fixture.advance(BUILTIN_LEASE - Duration::from_millis(1));
        assert!(lease("b/1", fixture.now()).await.unwrap().is_none(), "still held");
        // a/1 is gone: once its lease runs out, the call is orphaned and b/1 takes it over.
        fixture.advance(Duration::from_millis(1));
        let now = fixture.now();
        let orphaned = fixture.store.request(&code, "b1").await.unwrap().unwrap();
        assert!(orphaned.is_orphaned_builtin(now), "{orphaned:?}");
        let taken = lease("b/1", now).await.unwrap().expect("taken over");
        assert_eq!((taken.delivered_to.as_deref(), taken.deliveries), (Some("b/1"), 2));
        assert!(lease("a/1", now).await.unwrap().is_none(), "a/1 lost it");
        // Answered, it is leased to nobody.
        fixture
            .store
            .finish(&code, "b1", RequestStatus::Completed, answer("b1", json!({"ok": true})), Answerer::Relay, now, now)
            .await
            .unwrap();
        assert!(lease("b/1", now).await.unwrap().is_none());
        assert!(!fixture.store.request(&code, "b1").await.unwrap().unwrap().is_orphaned_builtin(now));
        // A tab's call is never leased as a built-in one.
        fixture.store.enqueue(&code, call("t1", now, json!({})), 10, now).await.unwrap();
        assert!(fixture.store.lease_builtin(&code, "t1", "a/1", now, now.plus(BUILTIN_LEASE)).await.unwrap().is_none());
    }

    async fn a_call_for_a_pushing_connection_is_handed_to_it_at_enqueue(fixture) {
        let now = fixture.now();
        let pushing = [("ws", Transport::WebSocket), ("sse", Transport::Sse), ("grpc", Transport::Grpc)];
        for (n, (connection, transport)) in pushing.into_iter().enumerate() {
            let code = code_of(&format!("PUSH{}234", ["A", "B", "C"][n]));
            fixture.store.insert_session(session(code.as_str(), now, HOUR)).await.unwrap();
            fixture.store.set_provider(&code, attached(connection, transport, now)).await.unwrap().unwrap();
            let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
            let Enqueued::Queued(record) =
                fixture.store.enqueue(&code, call("r1", now, json!({"x": 1})), 10, now).await.unwrap()
            else {
                panic!("not queued")
            };
            // Queued delivered to the connection, under a lease as long as the call lives.
            assert_eq!(record.status, RequestStatus::Delivered, "{transport:?}");
            assert_eq!(record.delivered_to.as_deref(), Some(connection));
            assert_eq!(record.lease_until, Some(record.deadline));
            assert_eq!((record.deliveries, record.args.clone()), (1, json!({"x": 1})));
            // Announced whole: its connection forwards it without a claim.
            assert_eq!(next_event(&mut events).await, SessionEvent::CallHanded(record.clone()));
            assert_eq!(fixture.store.request(&code, "r1").await.unwrap().as_ref(), Some(&*record));
            assert!(fixture.store.claim(&code, &claim(connection, now, HOUR)).await.unwrap().is_empty());
            // Its connection answers it; a connection that takes over claims it as before.
            fixture.store.enqueue(&code, call("r2", now, json!({})), 10, now).await.unwrap();
            let Finished::Finished(_) = fixture
                .store
                .finish(&code, "r1", RequestStatus::Completed, answer("r1", json!(1)), Answerer::Connection(connection), now, now)
                .await
                .unwrap()
            else {
                panic!("the connection it was handed to could not answer it")
            };
            fixture.store.set_provider(&code, provider("next", now)).await.unwrap();
            let moved = fixture.store.claim(&code, &claim("next", now, HOUR)).await.unwrap();
            assert_eq!(moved.iter().map(|record| (record.id.as_str(), record.deliveries)).collect::<Vec<_>>(), [("r2", 2)]);
        }
        // A polling provider, or none: queued for a claim, announced as queued.
        let code = with_session(&fixture).await;
        let mut events = fixture.store.subscribe(&code).await.unwrap().unwrap();
        let Enqueued::Queued(polled) = fixture.store.enqueue(&code, call("p1", now, json!({})), 10, now).await.unwrap() else {
            panic!("not queued")
        };
        assert_eq!((polled.status, polled.delivered_to.as_deref(), polled.deliveries), (RequestStatus::Queued, None, 0));
        assert_eq!(next_event(&mut events).await, SessionEvent::RequestQueued);
        fixture.store.clear_provider(&code, "tab-1").await.unwrap();
        let Enqueued::Queued(unserved) = fixture.store.enqueue(&code, call("p2", now, json!({})), 10, now).await.unwrap() else {
            panic!("not queued")
        };
        assert_eq!((unserved.status, unserved.delivered_to.as_deref()), (RequestStatus::Queued, None));
        assert_eq!(next_event(&mut events).await, SessionEvent::RequestQueued);
        // A built-in call is never handed to a tab, whatever its transport.
        fixture.store.set_provider(&code, attached("ws", Transport::WebSocket, now)).await.unwrap();
        let _ = next_event(&mut events).await;
        let mut builtin = call("b1", now, json!({}));
        builtin.builtin = true;
        let Enqueued::Queued(builtin) = fixture.store.enqueue(&code, builtin, 10, now).await.unwrap() else {
            panic!("not queued")
        };
        assert_eq!(builtin.delivered_to.as_deref(), Some("relay"));
        assert_eq!(next_event(&mut events).await, SessionEvent::RequestQueued);
    }

    async fn both_stores_evict_the_same_answers_for_the_same_calls(fixture) {
        let now = fixture.now();
        let share = limits().session_answer_budget;
        let (quiet, noisy) = (code_of("QUIET234"), code_of("NOISY234"));
        for code in [&quiet, &noisy] {
            assert!(fixture.store.insert_session(session(code.as_str(), now, HOUR)).await.unwrap());
        }
        // Answers of assorted sizes, some failed, within the total budget but over the noisy
        // session's share; the quiet one's stay.
        let sizes = [9_000, 200, 14_000, 3_000, 11, 20_000, 700, 6_500, 12_000, 11, 5_000, 16_000];
        let mut kept: Vec<(String, usize)> = Vec::new();
        let mut expected_evicted = Vec::new();
        let mut evicted_records = 0;
        let mut quiet_bytes = 0;
        for (n, bytes) in sizes.iter().enumerate() {
            for (code, id) in [(&quiet, format!("q{n}")), (&noisy, format!("n{n}"))] {
                let bytes = if code == &quiet { 11 } else { *bytes };
                fixture.store.enqueue(code, call(&id, now, json!({})), 100, now).await.unwrap();
                let response = if n % 5 == 4 {
                    ToolResponse {
                        request_id: id.clone(),
                        success: false,
                        result: None,
                        error: Some(toolrelay::wire::ToolError { code: "tool_error".into(), message: "e".repeat(bytes) }), content: None, structured_content: None,
                    }
                } else {
                    answer(&id, json!("x".repeat(bytes)))
                };
                let cost = toolrelay_relay::store::rules::answer_cost(&response);
                let status = if response.success { RequestStatus::Completed } else { RequestStatus::Failed };
                fixture.store.finish(code, &id, status, response, Answerer::Relay, now, now).await.unwrap();
                if code == &quiet {
                    quiet_bytes += cost;
                    continue;
                }
                // The rule: past its share, the session's oldest answers go first; an evicted
                // call's record still costs what a record does.
                kept.push((id, cost));
                while kept.iter().map(|(_, cost)| cost).sum::<usize>() + evicted_records > share {
                    let (id, _) = kept.remove(0);
                    evicted_records += toolrelay_relay::store::rules::expired_cost(&id);
                    expected_evicted.push(id);
                }
            }
        }
        let mut evicted = Vec::new();
        for n in 0..sizes.len() {
            let record = fixture.store.request(&noisy, &format!("n{n}")).await.unwrap().unwrap();
            if record.evicted {
                evicted.push(record.id);
            }
            let quiet_one = fixture.store.request(&quiet, &format!("q{n}")).await.unwrap().unwrap();
            assert!(!quiet_one.evicted, "{}", quiet_one.id);
        }
        assert_eq!(evicted, expected_evicted);
        // Each answer costs the same in both stores: the usage is the sum of the rule's costs.
        let noisy_bytes: usize = kept.iter().map(|(_, cost)| cost).sum();
        assert_eq!(
            fixture.store.usage().await.unwrap().answer_bytes,
            quiet_bytes + noisy_bytes + evicted_records
        );
        let answered: Vec<String> = fixture
            .store
            .responses(&noisy, None)
            .await
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|response| response.request_id)
            .collect();
        assert_eq!(answered, kept.into_iter().map(|(id, _)| id).collect::<Vec<_>>());
    }

    async fn both_stores_evict_the_oldest_answers_across_sessions_when_over_the_budget(fixture) {
        use toolrelay_relay::store::rules::{answer_cost, expired_cost};
        // Three sessions answer in turn, each well within its share, together past the whole
        // budget: the answers that go are the oldest of all, whichever session holds them.
        let budget = limits().answer_budget;
        let codes: Vec<SessionCode> = ["OLDA2345", "OLDB2345", "OLDC2345"].into_iter().map(code_of).collect();
        for code in &codes {
            assert!(fixture.store.insert_session(session(code.as_str(), fixture.now(), HOUR)).await.unwrap());
        }
        let mut kept: Vec<(SessionCode, String, usize)> = Vec::new();
        for n in 0..6 {
            for (i, code) in codes.iter().enumerate() {
                let (id, now) = (format!("a{n}"), fixture.now());
                fixture.store.enqueue(code, call(&id, now, json!({})), 100, now).await.unwrap();
                let response = answer(&id, json!("x".repeat(3_500 + 500 * i)));
                kept.push((code.clone(), id.clone(), answer_cost(&response)));
                fixture.store.finish(code, &id, RequestStatus::Completed, response, Answerer::Relay, now, now).await.unwrap();
                fixture.advance(Duration::from_millis(1));
            }
        }
        // The rule: the oldest answers go until what is kept fits; an evicted call's record
        // still costs what a record does.
        let (mut expected, mut evicted_records) = (Vec::new(), 0);
        while kept.iter().map(|(_, _, cost)| cost).sum::<usize>() + evicted_records > budget {
            let (code, id, _) = kept.remove(0);
            evicted_records += expired_cost(&id);
            expected.push((code, id));
        }
        assert!(expected.len() >= 3, "the calls should pass the budget by a few answers");
        // (A Redis replica keeps the total by its trim, which `usage` runs first.)
        assert_eq!(
            fixture.store.usage().await.unwrap().answer_bytes,
            kept.iter().map(|(_, _, cost)| cost).sum::<usize>() + evicted_records
        );
        let mut evicted = Vec::new();
        for n in 0..6 {
            for code in &codes {
                let record = fixture.store.request(code, &format!("a{n}")).await.unwrap().unwrap();
                assert_eq!(record.evicted, record.response.is_none(), "{}", record.id);
                if record.evicted {
                    evicted.push((code.clone(), record.id));
                }
            }
        }
        assert_eq!(evicted, expected);
    }
}
