//! The Redis store's scripts, each in a `.lua` file of its own (`lua/`), assembled here: a
//! `#!lua` line (so that Redis applies its rules for scripts with flags, among them that every
//! key a script touches on a Cluster node is in one slot), the constants of `rules.rs`, then
//! the libraries a script needs, then its body. Each body opens with named locals for its
//! arguments, in the order the functions of `super` pass them.

use std::marker::PhantomData;

use redis::{Cmd, Script};

use crate::store::rules;

const GCRA: &str = include_str!("lua/gcra.lua");
const LIBRARY: &str = include_str!("lua/library.lua");
const MCP: &str = include_str!("lua/mcp.lua");

/// The arguments a session script takes after the common ones (now, the retention), named
/// as its Lua body names them in its opening `local … = ARGV[3], …` (a test holds each to it).
pub(super) trait Arguments {
    /// The names, in order.
    #[cfg(test)]
    const NAMES: &'static [&'static str];
    /// Adds the values to `command` (the script's `EVALSHA`), in order.
    fn push(&self, command: &mut Cmd);
}

/// An argument struct as a type of its own, whatever it borrows (what [`SessionScript`] is
/// typed by).
pub(super) trait Named {
    type With<'a>: Arguments;
}

/// Defines argument structs: each field a string, in the script's order.
macro_rules! arguments {
    ($($(#[$meta:meta])* $name:ident { $($field:ident),+ $(,)? })*) => {
        $(
            $(#[$meta])*
            pub(super) struct $name<'a> {
                $(pub $field: &'a str,)+
            }

            impl Arguments for $name<'_> {
                #[cfg(test)]
                const NAMES: &'static [&'static str] = &[$(stringify!($field)),+];
                fn push(&self, command: &mut Cmd) {
                    $(command.arg(self.$field);)+
                }
            }

            impl Named for $name<'_> {
                type With<'a> = $name<'a>;
            }
        )*
    };
}

arguments! {
    /// `lua/insert.lua`.
    Insert { code, token_hash, created_at, expires_at, max_expires_at, mcp_handle }
    /// `lua/touch.lua`.
    Touch { until_ms, seen }
    /// `lua/set_provider.lua`.
    SetProvider { connection, transport, connected_at, last_seen, replica }
    /// `lua/clear_provider.lua`.
    ClearProvider { connection }
    /// `lua/set_token.lua`.
    SetToken { token_hash }
    /// `lua/set_manifest.lua`.
    SetManifest { manifest }
    /// `lua/enqueue.lua`.
    Enqueue {
        id, packed, max_pending, until_ms, revision, rate_interval, rate_tolerance, approval,
        approver,
    }
    /// `lua/flat_enqueue.lua`.
    FlatEnqueue {
        id, state, rest, builtin, lease, max_pending, until_ms, revision, rate_interval,
        rate_tolerance, approval, approver, me, avoid, route,
    }
    /// `lua/change_approvals.lua`.
    ChangeApprovals {
        book_set, expected_set, expected, book, approves, refused, allow, allow_kept, revoke,
        release, release_mode, fail_code, fail_message,
    }
    /// `lua/finish.lua`.
    Finish { id, status, response, cost, until_ms, answerer, connection, share, quiet }
    /// `lua/claim.lua`.
    ClaimCalls { connection, lease_until, limit, again }
    /// `lua/request.lua`.
    Request { id }
    /// `lua/lease_builtin.lua`.
    LeaseBuiltin { id, holder, until_ms }
    /// `lua/evict.lua`.
    Evict { keep_bytes, before }
}

/// A session script that takes no arguments of its own.
pub(super) struct NoArguments;

impl Arguments for NoArguments {
    #[cfg(test)]
    const NAMES: &'static [&'static str] = &[];
    fn push(&self, _: &mut Cmd) {}
}

impl Named for NoArguments {
    type With<'a> = NoArguments;
}

/// A session script (see [`session_script`]) with the arguments `A` names.
pub(super) struct SessionScript<A> {
    pub script: Script,
    /// Whether its writes wait for replicas when `REDIS_WAIT_REPLICAS` asks for it: a call's
    /// queueing and its answer, and a session's creation.
    pub replicated: bool,
    /// Its body, as written in `lua/`.
    #[cfg(test)]
    body: &'static str,
    arguments: PhantomData<fn(A)>,
}

impl<A: Named> SessionScript<A> {
    fn new(body: &'static str, sharded: bool) -> Self {
        Self {
            script: session_script(body, sharded),
            replicated: false,
            #[cfg(test)]
            body,
            arguments: PhantomData,
        }
    }

    /// A flat session script: its body alone (with the rules' constants and GCRA), no
    /// library; it answers in the session script's envelope itself.
    fn flat(body: &'static str, sharded: bool) -> Self {
        Self {
            script: script(&[GCRA, body], sharded),
            replicated: false,
            #[cfg(test)]
            body,
            arguments: PhantomData,
        }
    }

    /// The same, its writes waiting for replicas when asked to.
    fn replicated(self) -> Self {
        Self {
            replicated: true,
            ..self
        }
    }
}

/// The scripts.
pub(super) struct Scripts {
    pub insert: SessionScript<Insert<'static>>,
    pub session: SessionScript<NoArguments>,
    pub touch: SessionScript<Touch<'static>>,
    pub refresh: Script,
    pub delete: SessionScript<NoArguments>,
    pub set_provider: SessionScript<SetProvider<'static>>,
    pub clear_provider: SessionScript<ClearProvider<'static>>,
    pub set_token: SessionScript<SetToken<'static>>,
    pub set_manifest: SessionScript<SetManifest<'static>>,
    pub manifest: SessionScript<NoArguments>,
    pub store_manifest: Script,
    pub enqueue: SessionScript<Enqueue<'static>>,
    pub flat_enqueue: SessionScript<FlatEnqueue<'static>>,
    pub approvals: SessionScript<NoArguments>,
    pub change_approvals: SessionScript<ChangeApprovals<'static>>,
    pub finish: SessionScript<Finish<'static>>,
    /// `lua/flat_finish.lua`: the same arguments as `finish`.
    pub flat_finish: SessionScript<Finish<'static>>,
    pub claim: SessionScript<ClaimCalls<'static>>,
    pub request: SessionScript<Request<'static>>,
    pub responses: SessionScript<NoArguments>,
    pub pending: SessionScript<NoArguments>,
    pub lease_builtin: SessionScript<LeaseBuiltin<'static>>,
    pub evict: SessionScript<Evict<'static>>,
    pub put_ticket: Script,
    pub spend: Script,
    pub lock: Script,
    pub unlock: Script,
    pub open_mcp: Script,
    pub put_mcp: Script,
    pub touch_mcp: Script,
    pub delete_mcp: Script,
    pub place: Script,
    /// `lua/news.lua`.
    pub news: Script,
}

/// A script: the `#!lua` line, the rules' constants, `parts` in order; on a Cluster
/// (`sharded`) its events go by sharded pub/sub (`SPUBLISH`, to the session's shard only).
fn script(parts: &[&str], sharded: bool) -> Script {
    Script::new(&source(parts, sharded))
}

/// The source of [`script`].
fn source(parts: &[&str], sharded: bool) -> String {
    let mut source = format!("#!lua\n{}", rules::lua_preamble());
    for part in parts {
        source.push('\n');
        source.push_str(part);
    }
    if sharded {
        source = source.replace(PUBLISH, "redis.call('SPUBLISH'");
    }
    source
}

/// How the scripts publish an event (the only way they do, a test holds them to it).
const PUBLISH: &str = "redis.call('PUBLISH'";

/// A session script: its body runs as a function after the library, and the script answers
/// `{ calls it expired, the expiry it slid the session to (0: none), the body's answer }`
/// (see `super::RedisStore::run`).
fn session_script(body: &str, sharded: bool) -> Script {
    let wrapped = format!(
        "local function body()\n{body}\nend\nlocal answered = body()\nreturn {{ expired_calls, slid_to, answered }}"
    );
    script(&[GCRA, LIBRARY, &wrapped], sharded)
}

impl Scripts {
    pub(super) fn new(sharded: bool) -> Self {
        Self {
            insert: SessionScript::new(include_str!("lua/insert.lua"), sharded).replicated(),
            session: SessionScript::new(include_str!("lua/session.lua"), sharded),
            touch: SessionScript::new(include_str!("lua/touch.lua"), sharded),
            refresh: session_script(include_str!("lua/refresh.lua"), sharded),
            delete: SessionScript::new(include_str!("lua/delete.lua"), sharded),
            set_provider: SessionScript::new(include_str!("lua/set_provider.lua"), sharded),
            clear_provider: SessionScript::new(include_str!("lua/clear_provider.lua"), sharded),
            set_token: SessionScript::new(include_str!("lua/set_token.lua"), sharded).replicated(),
            set_manifest: SessionScript::new(include_str!("lua/set_manifest.lua"), sharded),
            manifest: SessionScript::new(include_str!("lua/manifest.lua"), sharded),
            store_manifest: script(&[include_str!("lua/store_manifest.lua")], sharded),
            enqueue: SessionScript::new(include_str!("lua/enqueue.lua"), sharded).replicated(),
            flat_enqueue: SessionScript::flat(include_str!("lua/flat_enqueue.lua"), sharded)
                .replicated(),
            approvals: SessionScript::new(include_str!("lua/approvals.lua"), sharded),
            change_approvals: SessionScript::new(include_str!("lua/change_approvals.lua"), sharded)
                .replicated(),
            finish: SessionScript::new(include_str!("lua/finish.lua"), sharded).replicated(),
            flat_finish: SessionScript::flat(include_str!("lua/flat_finish.lua"), sharded)
                .replicated(),
            claim: SessionScript::new(include_str!("lua/claim.lua"), sharded),
            request: SessionScript::new(include_str!("lua/request.lua"), sharded),
            responses: SessionScript::new(include_str!("lua/responses.lua"), sharded),
            pending: SessionScript::new(include_str!("lua/pending.lua"), sharded),
            lease_builtin: SessionScript::new(include_str!("lua/lease_builtin.lua"), sharded),
            evict: SessionScript::new(include_str!("lua/evict.lua"), sharded),
            put_ticket: script(&[include_str!("lua/put_ticket.lua")], sharded),
            spend: script(&[GCRA, include_str!("lua/spend.lua")], sharded),
            lock: script(&[include_str!("lua/lock.lua")], sharded),
            unlock: script(&[include_str!("lua/unlock.lua")], sharded),
            open_mcp: script(&[MCP, include_str!("lua/open_mcp.lua")], sharded),
            put_mcp: script(&[MCP, include_str!("lua/put_mcp.lua")], sharded),
            touch_mcp: script(&[MCP, include_str!("lua/touch_mcp.lua")], sharded),
            delete_mcp: script(&[MCP, include_str!("lua/delete_mcp.lua")], sharded),
            place: script(&[include_str!("lua/place.lua")], sharded),
            news: script(&[include_str!("lua/news.lua")], sharded),
        }
    }

    /// Every script, to load at connect (so a replica's first calls after a Redis restart do
    /// not each meet `NOSCRIPT` first).
    pub(super) fn all(&self) -> [&Script; 33] {
        [
            &self.insert.script,
            &self.session.script,
            &self.touch.script,
            &self.refresh,
            &self.delete.script,
            &self.set_provider.script,
            &self.clear_provider.script,
            &self.set_token.script,
            &self.set_manifest.script,
            &self.manifest.script,
            &self.store_manifest,
            &self.enqueue.script,
            &self.flat_enqueue.script,
            &self.approvals.script,
            &self.change_approvals.script,
            &self.finish.script,
            &self.flat_finish.script,
            &self.claim.script,
            &self.request.script,
            &self.responses.script,
            &self.pending.script,
            &self.lease_builtin.script,
            &self.evict.script,
            &self.put_ticket,
            &self.spend,
            &self.lock,
            &self.unlock,
            &self.open_mcp,
            &self.put_mcp,
            &self.touch_mcp,
            &self.delete_mcp,
            &self.place,
            &self.news,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body's arguments after the common ones, as its opening `local … = ARGV[3], …` names
    /// them.
    fn lua_names(body: &str) -> Vec<String> {
        let Some(at) = body.find("ARGV[3]") else {
            return Vec::new();
        };
        let statement = &body[..at];
        let start = statement.rfind("\nlocal ").map_or(0, |start| start + 1);
        let names = &statement[start + "local ".len()..statement.rfind('=').unwrap()];
        names
            .split(',')
            .map(|name| name.trim().to_owned())
            .collect()
    }

    fn assert_named<A: Named>(script: &SessionScript<A>) {
        assert_eq!(
            lua_names(script.body),
            <A::With<'_> as Arguments>::NAMES,
            "{}",
            script.body.lines().next().unwrap_or_default()
        );
    }

    /// Each session script's Rust arguments are its Lua locals, in order.
    #[test]
    fn each_script_s_arguments_are_named_as_its_lua_names_them() {
        let scripts = Scripts::new(false);
        assert_named(&scripts.insert);
        assert_named(&scripts.session);
        assert_named(&scripts.touch);
        assert_named(&scripts.delete);
        assert_named(&scripts.set_provider);
        assert_named(&scripts.clear_provider);
        assert_named(&scripts.set_token);
        assert_named(&scripts.set_manifest);
        assert_named(&scripts.manifest);
        assert_named(&scripts.enqueue);
        assert_named(&scripts.flat_enqueue);
        assert_named(&scripts.approvals);
        assert_named(&scripts.change_approvals);
        assert_named(&scripts.finish);
        assert_named(&scripts.flat_finish);
        assert_named(&scripts.claim);
        assert_named(&scripts.request);
        assert_named(&scripts.responses);
        assert_named(&scripts.pending);
        assert_named(&scripts.lease_builtin);
        assert_named(&scripts.evict);
    }

    /// On a Cluster every event goes by sharded pub/sub, elsewhere by plain pub/sub; the
    /// library is the one place that publishes, and only in the way that is switched.
    #[test]
    fn a_cluster_s_scripts_publish_to_the_session_s_shard() {
        let plain = source(&[LIBRARY], false);
        let sharded = source(&[LIBRARY], true);
        assert!(plain.contains(PUBLISH) && !plain.contains("SPUBLISH"));
        assert!(sharded.contains("redis.call('SPUBLISH'") && !sharded.contains(PUBLISH));
        assert_eq!(
            LIBRARY.matches("PUBLISH").count(),
            LIBRARY.matches(PUBLISH).count()
        );
        for body in [
            GCRA,
            MCP,
            include_str!("lua/enqueue.lua"),
            include_str!("lua/finish.lua"),
            include_str!("lua/change_approvals.lua"),
        ] {
            assert!(!body.contains("PUBLISH"), "only the library publishes");
        }
        // A flat script publishes by itself, in the one way that is switched.
        for flat in [
            include_str!("lua/flat_enqueue.lua"),
            include_str!("lua/flat_finish.lua"),
            include_str!("lua/news.lua"),
        ] {
            assert_eq!(
                flat.matches("PUBLISH").count(),
                flat.matches(PUBLISH).count()
            );
            assert!(!source(&[flat], true).contains(PUBLISH));
        }
    }

    /// The scripts spell no number the rules module owns: each comes from the preamble (unit
    /// conversions are written `1e3`).
    #[test]
    fn no_script_copies_a_rule_constant() {
        let sources = [
            GCRA,
            LIBRARY,
            include_str!("lua/enqueue.lua"),
            include_str!("lua/flat_enqueue.lua"),
            include_str!("lua/flat_finish.lua"),
            include_str!("lua/finish.lua"),
            include_str!("lua/claim.lua"),
            include_str!("lua/lease_builtin.lua"),
        ];
        for source in sources {
            for literal in ["10000", "65536", "1000", "256", "600"] {
                assert!(
                    !source.contains(literal),
                    "a script spells {literal} instead of naming the rule"
                );
            }
        }
    }
}
