//! The Redis store's scripts, each in a `.lua` file of its own (`lua/`), assembled here: a
//! `#!lua` line (so that Redis applies its rules for scripts with flags, among them that every
//! key a script touches on a Cluster node is in one slot), the constants of `rules.rs`, then
//! the libraries a script needs, then its body. Each body opens with named locals for its
//! arguments, in the order the functions of `super` pass them.

use redis::Script;

use crate::store::rules;

const GCRA: &str = include_str!("lua/gcra.lua");
const LIBRARY: &str = include_str!("lua/library.lua");
const MCP: &str = include_str!("lua/mcp.lua");

/// The scripts.
pub(super) struct Scripts {
    pub insert: Script,
    pub session: Script,
    pub touch: Script,
    pub refresh: Script,
    pub delete: Script,
    pub set_provider: Script,
    pub clear_provider: Script,
    pub set_manifest: Script,
    pub manifest: Script,
    pub store_manifest: Script,
    pub enqueue: Script,
    pub finish: Script,
    pub claim: Script,
    pub request: Script,
    pub responses: Script,
    pub pending: Script,
    pub lease_builtin: Script,
    pub evict: Script,
    pub put_ticket: Script,
    pub spend: Script,
    pub lock: Script,
    pub unlock: Script,
    pub open_mcp: Script,
    pub put_mcp: Script,
    pub touch_mcp: Script,
    pub delete_mcp: Script,
}

/// A script: the `#!lua` line, the rules' constants, `parts` in order.
fn script(parts: &[&str]) -> Script {
    let mut source = format!("#!lua\n{}", rules::lua_preamble());
    for part in parts {
        source.push('\n');
        source.push_str(part);
    }
    Script::new(&source)
}

/// A session script: its body runs as a function after the library, and the script answers
/// `{ calls it expired, the expiry it slid the session to (0: none), the body's answer }`
/// (see `super::RedisStore::run`).
fn session_script(body: &str) -> Script {
    let wrapped = format!(
        "local function body()\n{body}\nend\nlocal answered = body()\nreturn {{ expired_calls, slid_to, answered }}"
    );
    script(&[GCRA, LIBRARY, &wrapped])
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            insert: session_script(include_str!("lua/insert.lua")),
            session: session_script(include_str!("lua/session.lua")),
            touch: session_script(include_str!("lua/touch.lua")),
            refresh: session_script(include_str!("lua/refresh.lua")),
            delete: session_script(include_str!("lua/delete.lua")),
            set_provider: session_script(include_str!("lua/set_provider.lua")),
            clear_provider: session_script(include_str!("lua/clear_provider.lua")),
            set_manifest: session_script(include_str!("lua/set_manifest.lua")),
            manifest: session_script(include_str!("lua/manifest.lua")),
            store_manifest: script(&[include_str!("lua/store_manifest.lua")]),
            enqueue: session_script(include_str!("lua/enqueue.lua")),
            finish: session_script(include_str!("lua/finish.lua")),
            claim: session_script(include_str!("lua/claim.lua")),
            request: session_script(include_str!("lua/request.lua")),
            responses: session_script(include_str!("lua/responses.lua")),
            pending: session_script(include_str!("lua/pending.lua")),
            lease_builtin: session_script(include_str!("lua/lease_builtin.lua")),
            evict: session_script(include_str!("lua/evict.lua")),
            put_ticket: script(&[include_str!("lua/put_ticket.lua")]),
            spend: script(&[GCRA, include_str!("lua/spend.lua")]),
            lock: script(&[include_str!("lua/lock.lua")]),
            unlock: script(&[include_str!("lua/unlock.lua")]),
            open_mcp: script(&[MCP, include_str!("lua/open_mcp.lua")]),
            put_mcp: script(&[MCP, include_str!("lua/put_mcp.lua")]),
            touch_mcp: script(&[MCP, include_str!("lua/touch_mcp.lua")]),
            delete_mcp: script(&[MCP, include_str!("lua/delete_mcp.lua")]),
        }
    }

    /// Every script, to load at connect (so a replica's first calls after a Redis restart do
    /// not each meet `NOSCRIPT` first).
    pub(super) fn all(&self) -> [&Script; 26] {
        [
            &self.insert,
            &self.session,
            &self.touch,
            &self.refresh,
            &self.delete,
            &self.set_provider,
            &self.clear_provider,
            &self.set_manifest,
            &self.manifest,
            &self.store_manifest,
            &self.enqueue,
            &self.finish,
            &self.claim,
            &self.request,
            &self.responses,
            &self.pending,
            &self.lease_builtin,
            &self.evict,
            &self.put_ticket,
            &self.spend,
            &self.lock,
            &self.unlock,
            &self.open_mcp,
            &self.put_mcp,
            &self.touch_mcp,
            &self.delete_mcp,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scripts spell no number the rules module owns: each comes from the preamble (unit
    /// conversions are written `1e3`).
    #[test]
    fn no_script_copies_a_rule_constant() {
        let sources = [
            GCRA,
            LIBRARY,
            include_str!("lua/enqueue.lua"),
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
