//! The SDK's errors, sorted into [`StoreError`]s, and read back ([`error_code`]).
//!
//! Throttling after the SDK's retries is [`StoreError::Throttled`]; HTTP 5xx, timeouts, broken
//! connections and transaction conflicts are [`StoreError::Unavailable`]; validation errors are
//! [`StoreError::Invalid`], except a key that does not fit the table's key schema, which is
//! [`StoreError::Schema`]; a missing table is [`StoreError::TableNotFound`]; refused credentials or
//! permissions are [`StoreError::AccessDenied`]. A failed condition is not
//! an error but an outcome ([`rejected`]), and a canceled transaction is read per action
//! ([`cancellation_reasons`]).

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::get_item::GetItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::error::{
    ConditionalCheckFailedException, TransactionCanceledException,
};

use crate::CancellationReason;
use crate::store::StoreError;

const THROTTLING_CODES: [&str; 4] = [
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "ThrottledException",
];

/// Refused credentials or permissions: nothing passes until the credentials or the policy change.
const DENIED_CODES: [&str; 7] = [
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "MissingAuthenticationTokenException",
    "IncompleteSignatureException",
    "ExpiredTokenException",
    "InvalidClientTokenId",
];

/// What DynamoDB's `ValidationException` says when a request's key does not fit the table's key
/// schema: another partition key name or type, or a sort key the store does not send (or the other
/// way round). The first is the service's message for most cases; DynamoDB Local (checked: 11.1.0)
/// says the other three, the second also on the service.
const KEY_SCHEMA_MESSAGES: [&str; 4] = [
    "The provided key element does not match the schema",
    "One of the required keys was not given a value",
    "The number of conditions on the keys is invalid",
    "Type mismatch for key",
];

/// Service errors that may pass with a retry: the service's own trouble, and a collision with a
/// transaction on the same item (or with an earlier attempt of the same transaction, still running).
const TRANSIENT_CODES: [&str; 4] = [
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "TransactionInProgressException",
];

/// The service error code of an SDK error of one of the operations the store sends (what
/// [`StoreError::code`] reports).
pub(crate) fn error_code<'e>(err: &'e (dyn std::error::Error + 'static)) -> Option<&'e str> {
    macro_rules! code_of {
        ($($error:ty),*) => {$(
            if let Some(e) = err.downcast_ref::<SdkError<$error, HttpResponse>>() {
                return e.code();
            }
        )*};
    }
    code_of!(UpdateItemError, GetItemError, TransactWriteItemsError);
    None
}

/// Sorts an SDK error into the store's error kinds.
#[cold]
pub(crate) fn classify<E>(table: &str, err: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let transient = match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => {
            service.raw().status().is_server_error()
                || err.code().is_some_and(|c| TRANSIENT_CODES.contains(&c))
        }
        _ => false,
    };
    match err.code() {
        Some("ResourceNotFoundException") => StoreError::TableNotFound(table.to_owned()),
        Some(code) if DENIED_CODES.contains(&code) => StoreError::AccessDenied {
            table: table.to_owned(),
            source: Box::new(err),
        },
        // A transaction's items may be business items: their key mismatch stays a refused write.
        Some("ValidationException")
            if std::any::TypeId::of::<E>() != std::any::TypeId::of::<TransactWriteItemsError>()
                && err
                    .message()
                    .is_some_and(|m| KEY_SCHEMA_MESSAGES.iter().any(|k| m.contains(k))) =>
        {
            StoreError::Schema(format!(
                "table `{table}` does not have the store's key schema (DynamoDB: {}); `DynamoDbStore::check` (or `idempotent table check`) says what differs: use a table created by `DynamoDbStore::ensure_table`, or give the store the table's key attribute names and layout (`AttributeNames`, `DynamoDbStore::with_layout`)",
                err.message().unwrap_or_default()
            ))
        }
        Some("ValidationException") => StoreError::Invalid(Box::new(err)),
        Some(code) if THROTTLING_CODES.contains(&code) => StoreError::Throttled(Box::new(err)),
        _ if transient => StoreError::Unavailable(Box::new(err)),
        _ => StoreError::Other(Box::new(err)),
    }
}

/// The failed condition, when that is what the error is (it carries the old item, if there was one).
pub(super) fn rejected<R>(
    err: &SdkError<UpdateItemError, R>,
) -> Option<&ConditionalCheckFailedException> {
    match err.as_service_error()? {
        UpdateItemError::ConditionalCheckFailedException(e) => Some(e),
        _ => None,
    }
}

/// The canceled transaction, when that is what the error is.
pub(super) fn canceled<R>(
    err: &SdkError<TransactWriteItemsError, R>,
) -> Option<&TransactionCanceledException> {
    match err.as_service_error()? {
        TransactWriteItemsError::TransactionCanceledException(e) => Some(e),
        _ => None,
    }
}

/// One reason per action of a canceled transaction, in order (index 0 is the record).
pub(super) fn cancellation_reasons(
    canceled: &TransactionCanceledException,
) -> Vec<CancellationReason> {
    canceled
        .cancellation_reasons()
        .iter()
        .enumerate()
        .map(|(index, r)| CancellationReason {
            index,
            code: r.code().unwrap_or("None").to_owned(),
            message: r.message().map(str::to_owned),
            item: r.item().cloned(),
        })
        .collect()
}
