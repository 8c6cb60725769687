//! A call's future stays small (issue 44): the web framework boxes each request's future and
//! every layer around it holds it by value, so its size is copied several times per request.
//! A call's step is boxed where it runs ([`toolrelay_relay::operation::run`]) and a gRPC
//! call where it is sent ([`RelayApi::run`]); without that, `RelayApi::run` for a call was
//! ~33 KB in a release build, and its copies 5–7 % of the one-process loop's CPU.

use toolrelay_relay::api::RelayApi;
use toolrelay_relay::limits::Caller;
use toolrelay_relay::ops::{Call, Submit};
use toolrelay_relay::relay::CallInput;

/// The bound: ~2.9 KB in a release build, larger unoptimised, far below the ~33 KB (release)
/// of an unboxed step.
const AT_MOST: usize = 16 * 1024;

#[tokio::test]
async fn a_calls_future_stays_small_for_every_layer_that_holds_it() {
    let relay = toolrelay_relay::server::memory_relay(
        Default::default(),
        Default::default(),
        &Default::default(),
    );
    let api = RelayApi::Local(relay.clone());
    let caller = Caller::new(std::net::Ipv4Addr::LOCALHOST.into());
    let call = Call {
        code: "ABCDEFGH".into(),
        call: CallInput::default(),
        wait: None,
        news: false,
    };
    let submit = Submit {
        code: "ABCDEFGH".into(),
        call: CallInput::default(),
    };
    let sizes = [
        (
            "RelayApi::run(Call)",
            std::mem::size_of_val(&api.run(&caller, call.clone())),
        ),
        (
            "operation::run(Call)",
            std::mem::size_of_val(&toolrelay_relay::operation::run(call, &relay, &caller)),
        ),
        (
            "RelayApi::run(Submit)",
            std::mem::size_of_val(&api.run(&caller, submit)),
        ),
    ];
    for (name, size) in sizes {
        println!("{name}: {size} bytes");
        assert!(
            size <= AT_MOST,
            "{name}'s future is {size} bytes (at most {AT_MOST})"
        );
    }
}
