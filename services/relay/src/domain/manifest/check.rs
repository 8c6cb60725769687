//! Argument checks: a call's arguments checked against its function's compiled schema within
//! a budget ([`MAX_CHECK_COST`]), off the async threads when the check may take a while, and
//! the violations described briefly enough to go back to the caller.

use serde_json::Value;

use super::Function;
use super::cost::applications;
use crate::error::RelayError;

/// Most schema violations listed in one error message.
const MAX_REPORTED_PROBLEMS: usize = 5;
/// Longest description of one violation, in characters.
const MAX_PROBLEM_CHARS: usize = 200;
/// Check cost (schema nodes × argument values) above which a check leaves the async threads.
const INLINE_CHECK_COST: usize = 20_000;
/// Most a check may cost: about a second of one core in a debug build, a fraction of that in
/// a release build. A call over it is refused before any checking, with what to do instead.
pub const MAX_CHECK_COST: usize = 20_000_000;

impl Function {
    /// Checks arguments against the function's schema; the error lists what is wrong, where.
    pub fn check_arguments(&self, args: &Value) -> Result<(), RelayError> {
        match describe_violations(&self.validator, args) {
            None => Ok(()),
            Some(problems) => Err(RelayError::InvalidArguments {
                function: self.name.clone(),
                problems,
            }),
        }
    }

    /// What checking `args` costs at most, in subschemas applied to values, counting no
    /// further than `limit` (past it, `limit + 1`). Without recursion along the data every
    /// subschema applies to a value at most once, so subschemas times JSON values bounds it;
    /// with it, one schema can reach a value along several paths that each lead back to it
    /// (twice per level is 2^depth), so the applications are counted on the arguments.
    pub fn check_cost(&self, args: &Value, limit: usize) -> usize {
        if self.recursive {
            applications(&self.schema, args, limit)
        } else {
            self.schema_size
                .saturating_mul(toolrelay::json::values(args))
                .min(limit.saturating_add(1))
        }
    }

    /// [`Function::check_arguments`] within a budget: arguments that would cost more than
    /// [`MAX_CHECK_COST`] are refused before any checking, and a check that may take more
    /// than a moment (counting it included) runs on a blocking thread, so that no request can
    /// hold an async thread (and with it other requests) for long.
    pub async fn check_arguments_async(&self, args: &Value) -> Result<(), RelayError> {
        if self.check_cost(args, INLINE_CHECK_COST) <= INLINE_CHECK_COST {
            return self.check_arguments(args);
        }
        let (function, args) = (self.clone(), args.clone());
        tokio::task::spawn_blocking(move || {
            if function.check_cost(&args, MAX_CHECK_COST) > MAX_CHECK_COST {
                return Err(RelayError::InvalidArguments {
                    problems: format!(
                        "they hold {} JSON values, too many to check against this function's schema within the relay's budget; split the call into smaller ones",
                        toolrelay::json::values(&args),
                    ),
                    function: function.name,
                });
            }
            function.check_arguments(&args)
        })
        .await
        .map_err(|_| RelayError::InvalidArguments {
            function: self.name.clone(),
            problems: "checking them failed".into(),
        })?
    }
}
/// The first few ways `instance` breaks a schema, each with where it is, or `None` when it
/// does not.
pub fn describe_violations(validator: &jsonschema::Validator, instance: &Value) -> Option<String> {
    // The common case first, and quickly: `is_valid` stops at nothing and builds nothing.
    if validator.is_valid(instance) {
        return None;
    }
    let problems: Vec<String> = validator
        .iter_errors(instance)
        .take(MAX_REPORTED_PROBLEMS)
        .map(|error| {
            let path = error.instance_path().to_string();
            let at = if path.is_empty() {
                "(arguments)".to_owned()
            } else {
                path
            };
            // The validator quotes the offending value, which may be huge.
            format!(
                "at {at}: {}",
                shortened(&error.to_string(), MAX_PROBLEM_CHARS)
            )
        })
        .collect();
    (!problems.is_empty()).then(|| problems.join("; "))
}
/// `text` cut to at most `limit` characters, with an ellipsis when cut.
fn shortened(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}
