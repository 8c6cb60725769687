//! The relay's operations as units ([`crate::operation`]), from every family: the layer
//! between the wire and the domain ([`crate::relay`]).
//!
//! One file per family, as in the domain (`sessions.rs`, `manifests.rs`, `calls.rs`,
//! `waiting.rs`, `answers.rs`, `polling.rs`, `builtin.rs`, `claims.rs`, `approvals.rs`): each
//! holds the family's units — a struct holding the request, and its `impl Operation`: the
//! caller's checks around the domain step, its retry rule, its protobuf messages both ways, and
//! what a front end in front of a remote relay does first — listed in its `operations`
//! function. [`crate::operation`] says how to add one.
//!
//! The domain's steps are [`Relay`](crate::relay::Relay) methods, in plain Rust: the domain
//! names no gRPC, protobuf or remote type, and a test here holds it to that.

mod answers;
mod approvals;
mod builtin;
mod calls;
mod claims;
mod manifests;
pub mod operation;
mod polling;
mod sessions;
mod waiting;

pub use self::answers::*;
pub use self::approvals::*;
pub use self::builtin::*;
pub use self::calls::*;
pub use self::claims::*;
pub use self::manifests::*;
pub use self::polling::*;
pub use self::sessions::*;
pub use self::waiting::*;

/// Shows `visitor` every family's operations.
pub(crate) fn each_operation(visitor: &mut impl crate::operation::Visitor) {
    answers::operations(visitor);
    approvals::operations(visitor);
    builtin::operations(visitor);
    calls::operations(visitor);
    claims::operations(visitor);
    manifests::operations(visitor);
    polling::operations(visitor);
    sessions::operations(visitor);
    waiting::operations(visitor);
}

#[cfg(test)]
mod tests {
    /// How wire code is named in Rust: the gRPC and protobuf crates, the generated messages,
    /// the relay reached over gRPC, the units. Written in pieces, so that this file does not
    /// name them itself.
    const WIRE: [&str; 7] = [
        concat!("to", "nic"),
        concat!("pro", "st"),
        concat!("pro", "to::"),
        concat!("p", "b::"),
        concat!("Remote", "Relay"),
        concat!("re", "mote::"),
        concat!("crate::", "oper", "ation"),
    ];

    /// The domain imports no wire code: the units that know the wire are here, over it.
    #[test]
    fn the_domain_names_no_wire_code() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/domain");
        let mut named = Vec::new();
        let mut read = 0;
        let mut folders = vec![root.clone()];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    folders.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let file = path.strip_prefix(&root).unwrap().display().to_string();
                read += 1;
                for word in WIRE {
                    if text.contains(word) {
                        named.push(format!("domain/{file} names `{word}`"));
                    }
                }
            }
        }
        assert!(read >= 25, "the domain's files were not found in {root:?}");
        assert!(
            named.is_empty(),
            "the domain must not name wire code (it belongs in crate::ops): {}",
            named.join("; ")
        );
    }
}
