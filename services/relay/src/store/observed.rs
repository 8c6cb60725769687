//! [`Observed`]: any [`Store`] with each operation timed and its failures counted
//! (`toolrelay_store_operation_duration_seconds`, `toolrelay_store_errors_total`,
//! `toolrelay_store_full_total`, `toolrelay_store_up`). The relay wraps its store in one, and so does a gateway its own, so
//! both stores are measured the same way without either implementation knowing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::{
    Answerer, ApprovalChange, ApprovalState, BudgetStore, CallNews, CallProgress, Claim,
    EnqueueChecks, Enqueued, EventStream, Finished, Inserted, McpSessionCaps, McpSessionStore,
    McpSessionsFull, NewRequest, ProviderInfo, RateBudget, Reachable, RequestRecord, RoutedAnswer,
    SessionRecord, SessionStore, Store, StoreUsage, TabState, TicketStore,
};
use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::metrics::{Metrics, StoreOperation as Op};

/// A store whose operations are measured.
pub struct Observed {
    inner: Arc<dyn Store>,
    metrics: Metrics,
}

impl Observed {
    /// `store`, measured into `metrics`.
    pub fn wrap(store: Arc<dyn Store>, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            inner: store,
            metrics,
        })
    }

    /// Runs one operation, recording how long it took and whether it failed.
    async fn timed<T>(
        &self,
        operation: Op,
        run: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = run.await;
        self.metrics
            .store_operation(operation, started.elapsed(), result.is_ok());
        if let Err(StoreError::Full(_)) = &result {
            self.metrics.store_full();
        }
        result
    }
}

/// Writes, for each part of the store's interface, each method as one of `Observed`'s own,
/// forwarding to the inner store timed as the operation named after `=>`, and `impl $part for
/// Observed` calling them. The relay holds its `Observed` by type, so its calls take the
/// methods of its own, whose futures are not boxed: only the inner store's are (the interface
/// boxes each method's future, and a call makes several; BENCHMARKS.md, issue 44). What holds
/// it as `dyn Store` gets the same through the trait.
macro_rules! measured {
    () => {};
    ($(#[$part_meta:meta])* $part:ident [$($bound:tt)*] {
        $(
            $(#[$meta:meta])*
            fn $method:ident(&self $(, $arg:ident: $type:ty)* $(,)?)
                -> $output:ty => $operation:ident $body:tt
        )*
    } $($rest:tt)*) => {
        impl Observed {
            $(
                $(#[$meta])*
                pub async fn $method(&self $(, $arg: $type)*) -> Result<$output, StoreError> {
                    self.timed(Op::$operation, self.inner.$method($($arg),*)).await
                }
            )*
        }

        #[async_trait]
        impl $part for Observed {
            $(
                $(#[$meta])*
                async fn $method(&self $(, $arg: $type)*) -> Result<$output, StoreError> {
                    Observed::$method(self $(, $arg)*).await
                }
            )*
        }
        measured! { $($rest)* }
    };
}

crate::store_methods!(measured);
