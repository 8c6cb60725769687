//! Manifests: a session's tools, as its tab registers them and callers read them.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::Value;
use toolrelay::wire::{FunctionSpec, GroupedManifest, ToolGroup};

use super::{Relay, not_found};
use crate::builtin::{BUILTIN_GROUP, BUILTIN_GROUP_DESCRIPTION};
use crate::code::{self, SessionCode};
use crate::error::RelayError;
use crate::manifest::{Manifest, ManifestLimits};
use crate::store::SessionEvent;

impl Relay {
    /// The session's tools: the provider's, then the built-in ones (group [`BUILTIN_GROUP`]).
    /// Fetching them counts as activity.
    pub async fn manifest(&self, code: &str) -> Result<GroupedManifest, RelayError> {
        let (code, _) = self.live_session(code).await?;
        let session = self.touch(&code, None).await?;
        let mut grouped = self
            .manifest_of(&code, session.manifest_revision)
            .await?
            .grouped();
        let builtin: Vec<FunctionSpec> = self
            .inner
            .tools
            .list()
            .into_iter()
            .map(FunctionSpec::from)
            .collect();
        // A relay that runs no tools (one built without them) shows no empty group.
        if !builtin.is_empty() {
            grouped.tools.push(ToolGroup {
                id: BUILTIN_GROUP.to_owned(),
                description: BUILTIN_GROUP_DESCRIPTION.to_owned(),
                functions: builtin,
            });
        }
        Ok(grouped)
    }

    /// A stream with an item each time the session's manifest changes; it ends with the
    /// session. Lost events (and a shared store's periodic "look again") are checked against
    /// the manifest's revision, so an item always means a new manifest.
    pub(crate) async fn manifest_changes(
        &self,
        code: &str,
    ) -> Result<futures::stream::BoxStream<'static, ()>, RelayError> {
        let code = self.session_code(code).await?;
        // Subscribed before the revision is read, so no change falls between the two.
        let events = self.subscribe(&code).await?;
        let (code, session) = self.live_session(code.as_str()).await?;
        let store = Arc::clone(&self.inner.store);
        let changes = futures::stream::unfold(
            (events, session.manifest_revision),
            move |(mut events, seen)| {
                let store = Arc::clone(&store);
                let code = code.clone();
                async move {
                    loop {
                        match events.next().await? {
                            SessionEvent::SessionEnded => return None,
                            SessionEvent::ManifestChanged | SessionEvent::Missed => {
                                match store.session(&code).await {
                                    Ok(Some(session)) if session.manifest_revision != seen => {
                                        return Some(((), (events, session.manifest_revision)));
                                    }
                                    Ok(None) => return None,
                                    // Unchanged, or the store is unreachable: look again at
                                    // the next event.
                                    Ok(Some(_)) | Err(_) => {}
                                }
                            }
                            _ => {}
                        }
                    }
                }
            },
        );
        Ok(changes.boxed())
    }

    /// Replaces the manifest; returns the number of functions. Needs the provider token. A
    /// refused manifest leaves the previous one in place.
    pub async fn register_manifest(
        &self,
        code: &str,
        token: Option<&str>,
        tools: &Value,
    ) -> Result<usize, RelayError> {
        let (code, _) = self.authorized(code, token).await?;
        self.install_manifest(&code, tools, None).await
    }

    pub(crate) async fn install_manifest(
        &self,
        code: &SessionCode,
        tools: &Value,
        connection: Option<&str>,
    ) -> Result<usize, RelayError> {
        let manifest = Manifest::parse(tools, self.manifest_limits())?;
        for function in manifest.functions() {
            if self.inner.tools.contains(&function.name) || function.group_id() == BUILTIN_GROUP {
                return Err(RelayError::InvalidManifest {
                    reason: format!(
                        "{} is the name of a tool built into the relay (tool id {BUILTIN_GROUP}); give yours another name",
                        if function.group_id() == BUILTIN_GROUP {
                            BUILTIN_GROUP
                        } else {
                            &function.name
                        }
                    ),
                });
            }
        }
        let count = manifest.functions().len();
        let json = manifest.to_json();
        // A manifest lives in the store as long as the longest-lived session that registered
        // it: at most a session's lifetime from now.
        let kept_until = self.now().plus(self.inner.config.session_max_lifetime);
        self.within_ceiling(
            super::Ceiling::Manifests,
            &code::hash_token(&json),
            kept_until,
        )
        .await?;
        // Another session's copy of the same tools, if there is one: one compiled copy each.
        let manifest = self
            .inner
            .manifests
            .shared(&json, || Ok::<_, RelayError>(manifest))?;
        let revision = self
            .inner
            .store
            .set_manifest(code, json)
            .await?
            .ok_or_else(|| not_found(code))?;
        self.inner.manifests.put(code, revision, manifest);
        self.touch(code, connection).await?;
        tracing::info!(code = %code.redacted(), functions = count, "manifest registered");
        Ok(count)
    }

    /// Whether the session's manifest is no longer at `revision` (this replica's compiled
    /// one is stale).
    pub(super) async fn manifest_moved(
        &self,
        code: &SessionCode,
        revision: u64,
    ) -> Result<bool, RelayError> {
        let (_, session) = self.live_session(code.as_str()).await?;
        Ok(session.manifest_revision != revision)
    }

    /// The compiled manifest of `code` at `revision`: this replica's, or compiled from the
    /// store's JSON (registered through another replica, or forgotten here).
    pub(super) async fn manifest_of(
        &self,
        code: &SessionCode,
        revision: u64,
    ) -> Result<Arc<Manifest>, RelayError> {
        if let Some(manifest) = self.inner.manifests.get(code, revision) {
            return Ok(manifest);
        }
        let (revision, json) = self
            .inner
            .store
            .manifest(code)
            .await?
            .ok_or_else(|| not_found(code))?;
        let manifest = match json {
            Some(json) => self.inner.manifests.shared(&json, || {
                Manifest::from_json(&json, self.manifest_limits()).map_err(|error| {
                    RelayError::StoreUnavailable(crate::error::StoreError(format!(
                        "a stored manifest cannot be read: {error}"
                    )))
                })
            })?,
            None => Arc::new(Manifest::default()),
        };
        self.inner
            .manifests
            .put(code, revision, Arc::clone(&manifest));
        Ok(manifest)
    }

    pub(super) fn manifest_limits(&self) -> ManifestLimits {
        ManifestLimits {
            max_bytes: self.inner.config.max_manifest_bytes,
            max_functions: self.inner.config.max_functions,
            max_depth: self.inner.config.max_json_depth,
        }
    }
}
