//! The person's approval of new callers (RFC 8628's device flow is the model: a short code is
//! safe with rate limits *and* the person's approval). In a session whose tab approves callers,
//! the first use of its code by a caller the person has not allowed is held and shown in the
//! tab until the person answers; a guessed code gives nothing.
//!
//! The store keeps, per session, whether its tab approves callers, the allowed callers, the
//! held calls, and the relay's `Book` of questions (opaque to it): the one question the tab
//! shows now, the callers waiting behind it, the denials so far. A call's approval check is
//! part of its one enqueue round trip ([`crate::store::ApprovalCheck`]); everything here runs
//! only for a caller not allowed yet, and for the tab's answers.

use std::net::IpAddr;
use std::time::Duration;

use data_encoding::HEXLOWER;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use toolrelay::errors::ErrorCode;
use toolrelay::wire::CallerCard;

use super::{Relay, not_found};
use crate::caller::Caller;
use crate::clock::Timestamp;
use crate::code::{self, SessionCode};
use crate::error::RelayError;
use crate::store::{ApprovalChange, ApprovalCheck, ApprovalState, Release, SessionEvent};

/// Denials after which a session refuses new callers without asking (a new code starts over).
pub const DENIALS_BEFORE_REFUSING: u32 = 3;
/// The claim-check scope of caller handles: handle → the session and the caller it was
/// minted for.
const CALLER_HANDLES: &str = "caller-handle";
/// Hex digits of an approval id: 96 bits.
const ID_HEX: usize = 24;
/// Times a change of the book is tried against others changing it at once.
const BOOK_ATTEMPTS: usize = 8;
/// How long before a held call's deadline its question lapses (ms), so that the caller hears
/// `approval_timeout` rather than its call expiring unanswered.
const LAPSE_MARGIN_MS: i64 = 1_000;
/// Callers waiting behind the question asked now, at most; more are told to try again later.
const MAX_WAITING: usize = 32;

/// How a caller named a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Named {
    /// By its pairing code: a caller the person has not allowed is asked about.
    Code,
    /// By the session's connector handle (the secret of its `/mcp/s/{handle}` URL, in the
    /// tab's copied prompt): the tab gave it out, so its holder needs no approval.
    ConnectorHandle,
    /// By a caller handle minted when the person allowed the caller with this approval id.
    CallerHandle(String),
}

/// A caller asking to use a session, as the person is shown it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applicant {
    /// Its approval id in every session: a digest of the key its budgets count under.
    pub id: String,
    /// What it says it is.
    pub label: String,
    /// How it came.
    pub via: String,
    /// Its address.
    pub address: String,
    /// Known by its address alone (allowing it allows everyone there).
    pub shared_address: bool,
}

impl Applicant {
    /// The caller `caller`, whose budgets count under `key` ([`crate::limits::Limits::caller_key`]).
    pub fn of(caller: &Caller, key: &str) -> Self {
        Asker::of(caller).applicant(approval_id(key))
    }

    fn card(&self, at: Timestamp) -> CallerCard {
        CallerCard {
            caller_id: self.id.clone(),
            label: self.label.clone(),
            via: self.via.clone(),
            address: self.address.clone(),
            shared_address: self.shared_address,
            at: at.rfc3339(),
        }
    }
}

/// A caller as the person would be shown it, kept with its call until the call turns out to
/// need the person ([`Asker::applicant`]): most calls come from callers already allowed, and
/// nothing is written out for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asker {
    /// What it says it is, if it says.
    label: Option<String>,
    /// What it is called and how it came, by the kind of its identity.
    kind: (&'static str, &'static str),
    address: IpAddr,
    shared_address: bool,
}

impl Asker {
    /// The caller `caller`.
    pub fn of(caller: &Caller) -> Self {
        let kind = match caller.identity.as_ref().map(|id| id.as_str()) {
            Some(id) if id.starts_with("mcp:") => ("An MCP client", "MCP"),
            Some(id) if id.starts_with("handle:") => ("An MCP client", "MCP"),
            Some(id) if id.starts_with("user:") => ("ChatGPT", "GPT Actions"),
            Some(id) if id.starts_with("key:") => ("A client with an API key", "the HTTP API"),
            _ => ("A program", "the HTTP API"),
        };
        Self {
            label: caller.label.clone(),
            kind,
            address: caller.address,
            shared_address: caller.identity.is_none(),
        }
    }

    /// The applicant it is, under its approval id `id` ([`approval_id`]).
    pub fn applicant(&self, id: String) -> Applicant {
        let (label, via) = self.kind;
        Applicant {
            id,
            label: self.label.clone().unwrap_or_else(|| label.to_owned()),
            via: via.to_owned(),
            address: self.address.to_string(),
            shared_address: self.shared_address,
        }
    }
}

/// A caller's approval id: 96 bits of SHA-256 of the key its budgets count under.
pub fn approval_id(key: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"approval\0")
        .chain_update(key.as_bytes())
        .finalize();
    let mut hex = HEXLOWER.encode(&digest);
    hex.truncate(ID_HEX);
    hex
}

/// A question to the person about one caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Question {
    /// Its number in the session (so an answer names the question it answers).
    n: u64,
    /// Who asks.
    applicant: Applicant,
    /// While asked: when it lapses. While waiting: when its caller stops waiting.
    until: Timestamp,
}

/// The relay's book of a session's questions, kept whole in the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Book {
    /// Questions asked so far (the next one's number).
    asked: u64,
    /// Denials so far.
    denials: u32,
    /// The question the tab shows now.
    asking: Option<Question>,
    /// Callers waiting to be asked about, oldest first.
    waiting: Vec<Question>,
    /// The last question closed: its number, its caller, and how (`allowed`, `declined`,
    /// `timeout`).
    closed: Option<(u64, String, String)>,
}

impl Book {
    fn read(state: &ApprovalState) -> Self {
        state
            .book
            .as_deref()
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or_default()
    }

    fn write(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether `id` is asked about or waits to be.
    fn has(&self, id: &str) -> bool {
        self.asking
            .iter()
            .chain(&self.waiting)
            .any(|question| question.applicant.id == id)
    }

    /// Asks the next waiting caller still waiting, if nobody is asked about. The question
    /// lapses after `timeout`, or a second before its caller stops waiting (a held call's
    /// deadline), whichever comes first: the caller then hears `approval_timeout`.
    fn ask_next(&mut self, now: Timestamp, timeout: Duration) {
        while self.asking.is_none() && !self.waiting.is_empty() {
            let mut next = self.waiting.remove(0);
            let gives_up = Timestamp(next.until.0 - LAPSE_MARGIN_MS);
            if gives_up > now {
                next.until = now.plus(timeout).min(gives_up);
                self.asking = Some(next);
            }
        }
    }
}

/// What the person decided about a caller (or did not, in time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied.
    Deny,
    /// Not answered in time.
    Lapse,
}

impl Decision {
    fn outcome(self) -> &'static str {
        match self {
            Self::Allow => "allowed",
            Self::Deny => "declined",
            Self::Lapse => "timeout",
        }
    }
}

/// What a tab shows of its session's approvals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApprovalView {
    /// Whether the tab approves callers.
    pub approves: bool,
    /// The question asked now (its number and card).
    pub asking: Option<(u64, CallerCard)>,
    /// The last question closed: number, caller, outcome.
    pub closed: Option<(u64, String, String)>,
    /// The allowed callers.
    pub allowed: Vec<CallerCard>,
    /// Whether new callers are refused.
    pub refused: bool,
}

/// What the relay keeps of an allowed caller.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Allowed {
    card: CallerCard,
    handle: String,
}

/// What a caller handle names.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct HandleOf {
    code: String,
    caller: String,
}

impl Relay {
    /// The session a caller names, and how it named it ([`Named`]).
    pub(crate) async fn named_session(
        &self,
        text: &str,
    ) -> Result<(SessionCode, Named), RelayError> {
        match SessionCode::parse(text) {
            Ok(code) => Ok((code, Named::Code)),
            Err(invalid) if !code::is_handle(text) => Err(invalid),
            Err(_) => {
                let handle = text.to_ascii_lowercase();
                if let Some(code) = self.inner.store.session_by_handle(&handle).await? {
                    return Ok((code, Named::ConnectorHandle));
                }
                let owner = self.inner.store.ticket(CALLER_HANDLES, &handle).await?;
                let owner: Option<HandleOf> =
                    owner.and_then(|value| serde_json::from_value((*value).clone()).ok());
                match owner.and_then(|owner| Some((SessionCode::parse(&owner.code).ok()?, owner))) {
                    Some((code, owner)) => Ok((code, Named::CallerHandle(owner.caller))),
                    None => Err(RelayError::UnknownHandle),
                }
            }
        }
    }

    /// Lets `caller` use the session it named `text` (read its tools, its status, its answers;
    /// pair with it): in a session whose tab approves callers, a caller the person has not
    /// allowed is asked about first and waits for the answer, as a call would; a disconnected
    /// caller handle is refused. The session, how it was named, and the caller's own handle
    /// when the person allowed it by its code (empty for one allowed without: `open_codap`'s).
    pub(crate) async fn approved(
        &self,
        caller: &Caller,
        text: &str,
    ) -> Result<(SessionCode, Named, Option<String>), RelayError> {
        let (code, named) = self.named_session(text).await?;
        let handle = match &named {
            Named::ConnectorHandle => None,
            Named::CallerHandle(id) => {
                let state = self.approval_state(&code).await?;
                if state.approves && !state.allowed.iter().any(|(allowed, _)| allowed == id) {
                    return Err(RelayError::CallerDisconnected);
                }
                None
            }
            Named::Code => {
                let key = self.limits().caller_key(caller);
                self.vetted(&code, &Applicant::of(caller, &key)).await?
            }
        };
        Ok((code, named, handle))
    }

    /// Lets `caller` read the state of one of its own calls (`GET …/requests/{id}`; another
    /// caller's is not found, see `Relay::request_record`): where it stands, and an answer the
    /// relay gave on the person's behalf (declined, lapsed), which say nothing of the tab —
    /// a held caller follows its own call so; a tool's answer only once the person allowed
    /// the caller (a caller handle the person disconnected is asked about again).
    pub(crate) async fn readable(
        &self,
        caller: &Caller,
        text: &str,
        view: &super::RequestView,
    ) -> Result<(), RelayError> {
        let tools_answer = view.response.as_ref().is_some_and(|response| {
            let code = response.error.as_ref().map(|error| error.code.as_str());
            !matches!(
                code.and_then(ErrorCode::parse),
                Some(
                    ErrorCode::ApprovalDeclined
                        | ErrorCode::ApprovalTimeout
                        | ErrorCode::ApprovalRefused
                        | ErrorCode::TabNotConnected
                )
            )
        });
        if tools_answer {
            self.approved(caller, text).await?;
        }
        Ok(())
    }

    /// Waits until the person has allowed `applicant` to use the session by its code, asking
    /// if need be: its caller handle then; `None` at once when the session's tab does not
    /// approve callers.
    pub(crate) async fn vetted(
        &self,
        code: &SessionCode,
        applicant: &Applicant,
    ) -> Result<Option<String>, RelayError> {
        let state = self.approval_state(code).await?;
        if !state.approves {
            return Ok(None);
        }
        if let Some(handle) = allowed_handle(&state, &applicant.id) {
            return Ok(Some(handle));
        }
        if state.refused {
            return Err(approval_error(ErrorCode::ApprovalRefused, self));
        }
        let session = self
            .inner
            .store
            .session(code)
            .await?
            .ok_or_else(|| not_found(code))?;
        if self
            .connected_transport(&session, self.now())
            .await
            .is_none()
        {
            return Err(RelayError::TabNotConnected {
                code: code.display(),
            });
        }
        let give_up = self.now().plus(self.inner.config.approval_timeout);
        self.await_approval(code, applicant, give_up)
            .await
            .map(Some)
    }

    /// What a call by `caller` (key `key`) of a session it named `named` must pass.
    pub(crate) fn approval_check(named: &Named, key: &str) -> ApprovalCheck {
        match named {
            Named::Code => ApprovalCheck::Ask(approval_id(key)),
            Named::ConnectorHandle => ApprovalCheck::Exempt,
            Named::CallerHandle(id) => ApprovalCheck::Handle(id.clone()),
        }
    }

    async fn approval_state(&self, code: &SessionCode) -> Result<ApprovalState, RelayError> {
        self.inner
            .store
            .approvals(code)
            .await?
            .ok_or_else(|| not_found(code))
    }

    /// Makes `change` (a new book from the current one, by `edit`, which says what else
    /// changes), trying again while others change the book at once. `edit` returns `None`
    /// to change nothing; the change's outcome otherwise.
    async fn edit_book<T>(
        &self,
        code: &SessionCode,
        mut edit: impl FnMut(&ApprovalState, &mut Book, Timestamp) -> Option<(ApprovalChange, T)>,
    ) -> Result<Option<T>, RelayError> {
        for _ in 0..BOOK_ATTEMPTS {
            let state = self.approval_state(code).await?;
            let mut book = Book::read(&state);
            let now = self.now();
            let Some((mut change, outcome)) = edit(&state, &mut book, now) else {
                return Ok(None);
            };
            change.book = Some((state.book.clone(), book.write()));
            match self
                .inner
                .store
                .change_approvals(code, &change, now)
                .await?
            {
                Some(true) => {
                    if let Some(asking) = &book.asking {
                        self.lapse_later(code, asking.n, asking.until);
                    }
                    return Ok(Some(outcome));
                }
                Some(false) => continue,
                None => return Err(not_found(code)),
            }
        }
        Err(RelayError::StoreUnavailable(crate::error::StoreError(
            "the session's approvals kept changing".into(),
        )))
    }

    /// Puts `applicant` before the person: asked now if nobody is, else after those waiting
    /// (it waits until `give_up` at most). A question past its time is closed first.
    pub(crate) async fn ask(
        &self,
        code: &SessionCode,
        applicant: &Applicant,
        give_up: Timestamp,
    ) -> Result<(), RelayError> {
        self.close_lapsed(code).await?;
        let timeout = self.inner.config.approval_timeout;
        self.edit_book(code, |state, book, now| {
            if book.has(&applicant.id) || state.allowed.iter().any(|(id, _)| *id == applicant.id) {
                return None;
            }
            if book.waiting.len() >= MAX_WAITING {
                return None;
            }
            book.asked += 1;
            let question = Question {
                n: book.asked,
                applicant: applicant.clone(),
                until: give_up,
            };
            book.waiting.push(question);
            book.ask_next(now, timeout);
            Some((ApprovalChange::default(), ()))
        })
        .await?;
        Ok(())
    }

    /// Closes the question asked now if its time is up.
    async fn close_lapsed(&self, code: &SessionCode) -> Result<(), RelayError> {
        let state = self.approval_state(code).await?;
        let book = Book::read(&state);
        if let Some(asking) = book.asking
            && asking.until <= self.now()
        {
            Box::pin(self.decide(code, &asking.applicant.id, Some(asking.n), Decision::Lapse))
                .await
                .or_else(|error| match error {
                    RelayError::ApprovalNotPending => Ok(""),
                    error => Err(error),
                })?;
        }
        Ok(())
    }

    /// Closes the question asked `n` at `until`, if it is still open then.
    fn lapse_later(&self, code: &SessionCode, n: u64, until: Timestamp) {
        let relay = self.clone();
        let code = code.clone();
        let wake = self.inner.clock.instant(until);
        tokio::spawn(async move {
            tokio::time::sleep_until(wake).await;
            let state = match relay.approval_state(&code).await {
                Ok(state) => state,
                Err(_) => return,
            };
            let Some(asking) = Book::read(&state).asking else {
                return;
            };
            if asking.n == n {
                let closed = relay
                    .decide(&code, &asking.applicant.id, Some(n), Decision::Lapse)
                    .await;
                if let Err(error) = closed
                    && !matches!(error, RelayError::ApprovalNotPending)
                {
                    tracing::warn!(code = %code.redacted(), %error, "could not close a lapsed question");
                }
            }
        });
    }

    /// The person's decision about the caller `caller_id` (the one asked about now; with `n`,
    /// only if it is that question): its held calls go on, or fail; an allowed caller gets a
    /// caller handle. Returns the outcome's name.
    pub(crate) async fn decide(
        &self,
        code: &SessionCode,
        caller_id: &str,
        n: Option<u64>,
        decision: Decision,
    ) -> Result<&'static str, RelayError> {
        let timeout = self.inner.config.approval_timeout;
        let handle = code::random_id();
        if decision == Decision::Allow {
            // The handle works before anyone hears of the Allow (a waiting connect_session
            // answers it at once); one minted for an answer that then does not count names a
            // caller never allowed, and is refused as disconnected.
            let session = self
                .inner
                .store
                .session(code)
                .await?
                .ok_or_else(|| not_found(code))?;
            let owner = HandleOf {
                code: code.as_str().to_owned(),
                caller: caller_id.to_owned(),
            };
            let owner = serde_json::to_value(owner).unwrap_or_default();
            self.inner
                .store
                .put_ticket(
                    CALLER_HANDLES,
                    &handle,
                    std::sync::Arc::new(owner),
                    session.max_expires_at,
                )
                .await?;
        }
        let mut refused_others = Vec::new();
        let decided = self
            .edit_book(code, |_, book, now| {
                let asking = book.asking.as_ref()?;
                if asking.applicant.id != caller_id || n.is_some_and(|n| n != asking.n) {
                    return None;
                }
                // A question lapses at its time, whoever looks first: an answer after it is late.
                if (decision == Decision::Lapse) == (asking.until > now) {
                    return None;
                }
                let asking = book.asking.take()?;
                book.closed = Some((asking.n, caller_id.to_owned(), decision.outcome().into()));
                let mut change = ApprovalChange::default();
                match decision {
                    Decision::Allow => {
                        let kept = Allowed {
                            card: asking.applicant.card(now),
                            handle: handle.clone(),
                        };
                        change.allow = Some((
                            caller_id.to_owned(),
                            serde_json::to_string(&kept).unwrap_or_default(),
                        ));
                        change.release = Some((caller_id.to_owned(), Release::Queue));
                    }
                    Decision::Deny => {
                        book.denials += 1;
                        change.release = Some((caller_id.to_owned(), declined()));
                        if book.denials >= DENIALS_BEFORE_REFUSING {
                            change.refused = Some(true);
                            refused_others = std::mem::take(&mut book.waiting)
                                .into_iter()
                                .map(|question| question.applicant.id)
                                .collect();
                        }
                    }
                    Decision::Lapse => {
                        change.release = Some((caller_id.to_owned(), lapsed(timeout)));
                    }
                }
                book.ask_next(now, timeout);
                Some((change, decision.outcome()))
            })
            .await?;
        let Some(outcome) = decided else {
            if decision != Decision::Lapse {
                // A lapsed question nobody closed yet (its replica is gone) is closed now.
                self.close_lapsed(code).await?;
            }
            return Err(RelayError::ApprovalNotPending);
        };
        for other in refused_others {
            let change = ApprovalChange {
                release: Some((other, refused())),
                ..ApprovalChange::default()
            };
            self.inner
                .store
                .change_approvals(code, &change, self.now())
                .await?;
        }
        tracing::info!(code = %code.redacted(), outcome, "the person answered about a new caller");
        Ok(outcome)
    }

    /// The person disconnects the allowed caller `caller_id`: its handle stops working.
    pub(crate) async fn disconnect_caller(
        &self,
        code: &SessionCode,
        caller_id: &str,
    ) -> Result<(), RelayError> {
        let change = ApprovalChange {
            revoke: Some(caller_id.to_owned()),
            ..ApprovalChange::default()
        };
        self.inner
            .store
            .change_approvals(code, &change, self.now())
            .await?
            .ok_or_else(|| not_found(code))?;
        Ok(())
    }

    /// Whether the session's tab approves callers, and sets it when the tab says otherwise.
    pub(crate) async fn set_approving(
        &self,
        code: &SessionCode,
        approves: bool,
    ) -> Result<(), RelayError> {
        let state = self.approval_state(code).await?;
        if state.approves != approves {
            let change = ApprovalChange {
                approves: Some(approves),
                ..ApprovalChange::default()
            };
            self.inner
                .store
                .change_approvals(code, &change, self.now())
                .await?;
        }
        if !approves && !state.held.is_empty() {
            // Nobody asks any more: the held calls go on, and the questions close.
            let mut callers: Vec<&String> = state.held.iter().map(|(caller, _)| caller).collect();
            callers.sort_unstable();
            callers.dedup();
            for caller in callers {
                let change = ApprovalChange {
                    release: Some((caller.clone(), Release::Queue)),
                    ..ApprovalChange::default()
                };
                self.inner
                    .store
                    .change_approvals(code, &change, self.now())
                    .await?;
            }
            self.edit_book(code, |_, book, _| {
                if book.asking.is_none() && book.waiting.is_empty() {
                    return None;
                }
                book.asking = None;
                book.waiting.clear();
                Some((ApprovalChange::default(), ()))
            })
            .await?;
        }
        Ok(())
    }

    /// Allows the caller `key` without asking (the MCP session that minted a claim the tab
    /// redeemed: the tab was opened for it).
    pub(crate) async fn allow_without_asking(
        &self,
        code: &SessionCode,
        applicant: &Applicant,
    ) -> Result<(), RelayError> {
        let kept = Allowed {
            card: applicant.card(self.now()),
            handle: String::new(),
        };
        let change = ApprovalChange {
            allow: Some((
                applicant.id.clone(),
                serde_json::to_string(&kept).unwrap_or_default(),
            )),
            ..ApprovalChange::default()
        };
        self.inner
            .store
            .change_approvals(code, &change, self.now())
            .await?;
        Ok(())
    }

    /// What the session's tab shows of its approvals (none when it does not approve callers).
    pub(crate) async fn approval_view(
        &self,
        code: &SessionCode,
    ) -> Result<ApprovalView, RelayError> {
        let state = self.approval_state(code).await?;
        let book = Book::read(&state);
        // A question past its time whose replica is gone (its timer with it) is closed by
        // whoever looks: the tab's connection, a poll.
        if let Some(asking) = &book.asking
            && asking.until <= self.now()
        {
            self.lapse_later(code, asking.n, asking.until);
        }
        let allowed = state
            .allowed
            .iter()
            .filter_map(|(_, kept)| serde_json::from_str::<Allowed>(kept).ok())
            .map(|allowed| allowed.card)
            .collect();
        Ok(ApprovalView {
            approves: state.approves,
            asking: book
                .asking
                .map(|asking| (asking.n, asking.applicant.card(asking.until))),
            closed: book.closed,
            allowed,
            refused: state.refused,
        })
    }

    /// Waits (until `give_up`) for the person to allow `applicant` to use the session, asking
    /// if need be; its caller handle once allowed. A caller allowed already gets its handle at
    /// once.
    pub(crate) async fn await_approval(
        &self,
        code: &SessionCode,
        applicant: &Applicant,
        give_up: Timestamp,
    ) -> Result<String, RelayError> {
        use futures::StreamExt;
        let mut events = self.subscribe(code).await?;
        let mut asked = false;
        loop {
            let state = self.approval_state(code).await?;
            if let Some(handle) = allowed_handle(&state, &applicant.id) {
                return Ok(handle);
            }
            let book = Book::read(&state);
            if !book.has(&applicant.id) {
                if asked {
                    // Its question closed without allowing it.
                    return Err(match &book.closed {
                        Some((_, id, outcome)) if *id == applicant.id && outcome == "declined" => {
                            approval_error(ErrorCode::ApprovalDeclined, self)
                        }
                        _ if state.refused => approval_error(ErrorCode::ApprovalRefused, self),
                        _ => approval_error(ErrorCode::ApprovalTimeout, self),
                    });
                }
                if state.refused {
                    return Err(approval_error(ErrorCode::ApprovalRefused, self));
                }
                self.ask(code, applicant, give_up).await?;
                asked = true;
                continue;
            }
            asked = true;
            let wake = self.inner.clock.instant(give_up);
            tokio::select! {
                event = events.next() => match event {
                    Some(SessionEvent::SessionEnded) | None => return Err(not_found(code)),
                    Some(_) => {}
                },
                () = tokio::time::sleep_until(wake) => {
                    return Err(approval_error(ErrorCode::ApprovalTimeout, self));
                }
            }
        }
    }
}

/// The caller handle of `id`, if the person allowed it.
fn allowed_handle(state: &ApprovalState, id: &str) -> Option<String> {
    let (_, kept) = state.allowed.iter().find(|(allowed, _)| allowed == id)?;
    let kept: Allowed = serde_json::from_str(kept).ok()?;
    Some(kept.handle)
}

fn declined() -> Release {
    Release::Fail {
        code: ErrorCode::ApprovalDeclined,
        message: DECLINED.to_owned(),
    }
}

fn refused() -> Release {
    Release::Fail {
        code: ErrorCode::ApprovalRefused,
        message: REFUSED.to_owned(),
    }
}

fn lapsed(timeout: Duration) -> Release {
    Release::Fail {
        code: ErrorCode::ApprovalTimeout,
        message: lapsed_message(timeout),
    }
}

const DECLINED: &str = "The person using this session denied your request to use it in their tab; the tool did not run. Do not try again unless they ask you to.";
const REFUSED: &str = "The person denied three requests to use this session, so it takes no new ones. Ask them for a new code (their plugin offers New code).";

fn lapsed_message(timeout: Duration) -> String {
    format!(
        "Nobody answered the question about your request in the person's tab within {} s; the tool did not run. Ask them to look at their CODAP (or the page serving this session) and press Allow, then call again.",
        timeout.as_secs()
    )
}

fn approval_error(code: ErrorCode, relay: &Relay) -> RelayError {
    match code {
        ErrorCode::ApprovalDeclined => RelayError::Approval {
            code,
            message: DECLINED.to_owned(),
        },
        ErrorCode::ApprovalRefused => RelayError::Approval {
            code,
            message: REFUSED.to_owned(),
        },
        _ => RelayError::Approval {
            code,
            message: lapsed_message(relay.inner.config.approval_timeout),
        },
    }
}
