//! What a tab was last shown of its session's approvals, and what it must be shown next: a
//! pure comparison, with no IO in it.

use toolrelay::wire::CallerCard;

use crate::downlink::Downlink;
use crate::relay::approvals::ApprovalView;

/// What a tab was last shown of its session's approvals.
#[derive(Debug, Default)]
pub(super) struct Shown {
    /// The question shown: its number and caller.
    asking: Option<(u64, String)>,
    /// The allowed callers and whether new ones are refused.
    callers: Option<(Vec<CallerCard>, bool)>,
}

/// The frames that bring a tab from what it was shown (`shown`; `None`: nothing yet) to the
/// session's approvals as they are (`view`), and `shown` brought up to date: the end of the
/// question it was asked (with its outcome, or `timeout` when the view no longer records it),
/// the question asked now, the allowed callers when they changed. A tab that does not approve
/// callers, and never did on this connection, is shown nothing: a raw client's protocol stays
/// as it was.
pub(super) fn changes(shown: &mut Option<Shown>, view: ApprovalView) -> Vec<Downlink> {
    let mut messages = Vec::new();
    if shown.is_none() && !view.approves {
        return messages;
    }
    let shown = shown.get_or_insert_with(Shown::default);
    let asking = view
        .asking
        .as_ref()
        .map(|(n, card)| (*n, card.caller_id.clone()));
    if shown.asking != asking {
        if let Some((n, caller)) = shown.asking.take() {
            let outcome = match &view.closed {
                Some((closed, _, outcome)) if *closed == n => outcome.clone(),
                _ => "timeout".to_owned(),
            };
            messages.push(Downlink::ApprovalClosed(Box::new((caller, outcome))));
        }
        if let Some((_, card)) = view.asking {
            messages.push(Downlink::ApprovalRequest(Box::new(card)));
        }
        shown.asking = asking;
    }
    let callers = Some((view.allowed, view.refused));
    if shown.callers != callers {
        if let Some((allowed, refused)) = &callers {
            messages.push(Downlink::Callers(Box::new((allowed.clone(), *refused))));
        }
        shown.callers = callers;
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(caller_id: &str) -> CallerCard {
        CallerCard {
            caller_id: caller_id.to_owned(),
            label: "Claude".to_owned(),
            via: "MCP".to_owned(),
            address: "192.0.2.1".to_owned(),
            shared_address: false,
            at: "2026-11-29T00:00:00Z".to_owned(),
        }
    }

    fn view(
        approves: bool,
        asking: Option<(u64, &str)>,
        closed: Option<(u64, &str, &str)>,
        allowed: &[&str],
    ) -> ApprovalView {
        ApprovalView {
            approves,
            asking: asking.map(|(n, caller)| (n, card(caller))),
            closed: closed.map(|(n, caller, outcome)| (n, caller.to_owned(), outcome.to_owned())),
            allowed: allowed.iter().map(|caller| card(caller)).collect(),
            refused: false,
        }
    }

    fn closed(caller: &str, outcome: &str) -> Downlink {
        Downlink::ApprovalClosed(Box::new((caller.to_owned(), outcome.to_owned())))
    }

    fn request(caller: &str) -> Downlink {
        Downlink::ApprovalRequest(Box::new(card(caller)))
    }

    fn callers(allowed: &[&str]) -> Downlink {
        let allowed = allowed.iter().map(|caller| card(caller)).collect();
        Downlink::Callers(Box::new((allowed, false)))
    }

    /// Views in the order a connection sees them, and what each shows the tab.
    #[test]
    fn a_tab_is_shown_what_changed_in_its_approvals() {
        let steps: Vec<(ApprovalView, Vec<Downlink>)> = vec![
            // Nothing to approve: a tab that does not approve callers hears nothing.
            (view(false, None, None, &[]), vec![]),
            // It turns approval on: it hears who is allowed (no one yet).
            (view(true, None, None, &[]), vec![callers(&[])]),
            // The same again: nothing.
            (view(true, None, None, &[]), vec![]),
            // A caller is held: the question.
            (view(true, Some((1, "c1")), None, &[]), vec![request("c1")]),
            // The person allows it: the question ends allowed, and the list changes.
            (
                view(true, None, Some((1, "c1", "allowed")), &["c1"]),
                vec![closed("c1", "allowed"), callers(&["c1"])],
            ),
            // A second question, then a third before the second was recorded closed: the
            // second lapsed.
            (
                view(true, Some((2, "c2")), Some((1, "c1", "allowed")), &["c1"]),
                vec![request("c2")],
            ),
            (
                view(true, Some((3, "c3")), Some((1, "c1", "allowed")), &["c1"]),
                vec![closed("c2", "timeout"), request("c3")],
            ),
            // Approval turned off later: what it was shown still ends.
            (
                view(false, None, Some((3, "c3", "denied")), &["c1"]),
                vec![closed("c3", "denied")],
            ),
        ];
        let mut shown = None;
        for (n, (view, expected)) in steps.into_iter().enumerate() {
            assert_eq!(changes(&mut shown, view), expected, "step {n}");
        }
    }
}
