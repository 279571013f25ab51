//! The SDK's errors, sorted into [`StoreError`]s ([`store_error`]), each with its service's error code
//! ([`error_code`], boxed with the error as a [`CodedError`] for [`StoreError::code`]).
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
use crate::store::{CodedError, StoreError};

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

/// Sorts an SDK error into the store's error kinds ([`classify`]), carrying its service's error code.
#[cold]
pub(crate) fn store_error<E>(table: &str, err: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match error_code(&err).map(str::to_owned) {
        Some(code) => with_code(code, classify(table, err)),
        None => classify(table, err),
    }
}

/// Boxes the error `sorted` holds with `code`, for [`StoreError::code`].
fn with_code(code: String, sorted: StoreError) -> StoreError {
    let coded = |error| -> crate::error::BoxError { Box::new(CodedError::new(code, error)) };
    match sorted {
        StoreError::Throttled(e) => StoreError::Throttled(coded(e)),
        StoreError::Unavailable(e) => StoreError::Unavailable(coded(e)),
        StoreError::Invalid(e) => StoreError::Invalid(coded(e)),
        StoreError::Other(e) => StoreError::Other(coded(e)),
        StoreError::AccessDenied { table, source } => StoreError::AccessDenied {
            table,
            source: coded(source),
        },
        other => other,
    }
}

/// Sorts an SDK error into the store's error kinds.
#[cold]
pub(crate) fn classify<E>(table: &str, err: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    // No credentials to sign with: the SDK fails before sending, as a dispatch failure, and nothing
    // passes until credentials are configured (not an outage, which a retry or a failover would help).
    if let SdkError::DispatchFailure(failure) = &err
        && credentials_unavailable(failure)
    {
        return StoreError::AccessDenied {
            table: table.to_owned(),
            source: Box::new(err),
        };
    }
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

/// Whether a dispatch failure is the credentials provider's finding that there are no credentials, or
/// that their configuration is invalid (a provider that timed out or failed may pass, and stays
/// transient).
fn credentials_unavailable(
    failure: &aws_smithy_runtime_api::client::result::DispatchFailure,
) -> bool {
    use aws_credential_types::provider::error::CredentialsError;
    let mut source: Option<&(dyn std::error::Error + 'static)> = failure
        .as_connector_error()
        .map(|e| e as &(dyn std::error::Error + 'static));
    while let Some(error) = source {
        if let Some(credentials) = error.downcast_ref::<CredentialsError>() {
            return matches!(
                credentials,
                CredentialsError::CredentialsNotLoaded(_)
                    | CredentialsError::InvalidConfiguration(_)
            );
        }
        source = error.source();
    }
    false
}

/// Whether DynamoDB refused the request because a key does not fit its table's key schema (in a
/// transaction, it does not say which table's).
pub(super) fn key_schema_mismatch<E: ProvideErrorMetadata>(
    err: &SdkError<E, HttpResponse>,
) -> bool {
    err.code() == Some("ValidationException")
        && err
            .message()
            .is_some_and(|m| KEY_SCHEMA_MESSAGES.iter().any(|k| m.contains(k)))
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

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::config::http::HttpResponse;
    use aws_sdk_dynamodb::error::{ErrorMetadata, SdkError};
    use aws_sdk_dynamodb::operation::create_table::CreateTableError;
    use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
    use aws_smithy_types::body::SdkBody;

    use super::{classify, store_error};
    use crate::store::{CodedError, StoreError};

    fn response(status: u16) -> HttpResponse {
        HttpResponse::new(status.try_into().unwrap(), SdkBody::empty())
    }

    fn update_error(code: &str, status: u16) -> SdkError<UpdateItemError, HttpResponse> {
        let error = UpdateItemError::generic(
            ErrorMetadata::builder()
                .code(code)
                .message("the service says why")
                .build(),
        );
        SdkError::service_error(error, response(status))
    }

    /// Attaching the code changes neither the kind, nor the message, nor the error chain: the store
    /// error reads as `classify`'s, and only `code()` and the box's type differ.
    #[test]
    fn the_code_is_carried_without_changing_the_error() {
        for (code, status) in [
            ("ThrottlingException", 400),
            ("ValidationException", 400),
            ("InternalServerError", 500),
            ("AccessDeniedException", 400),
        ] {
            let sorted = classify("t", update_error(code, status));
            let coded = store_error("t", update_error(code, status));
            assert_eq!(
                std::mem::discriminant(&coded),
                std::mem::discriminant(&sorted),
                "{code}"
            );
            assert_eq!(coded.to_string(), sorted.to_string(), "{code}");
            assert_eq!(
                crate::error::chain(&coded),
                crate::error::chain(&sorted),
                "{code}"
            );
            assert_eq!(format!("{coded:?}"), format!("{sorted:?}"), "{code}");
            assert_eq!(coded.code(), Some(code));
            assert_eq!(
                sorted.code(),
                None,
                "the code comes through `CodedError` only"
            );
            let (StoreError::Throttled(e)
            | StoreError::Invalid(e)
            | StoreError::Unavailable(e)
            | StoreError::Other(e)
            | StoreError::AccessDenied { source: e, .. }) = &coded
            else {
                panic!("{code}: {coded:?}")
            };
            let wrapped = e.downcast_ref::<CodedError>().unwrap().get_ref();
            assert!(
                wrapped
                    .downcast_ref::<SdkError<UpdateItemError, HttpResponse>>()
                    .is_some()
            );
        }
    }

    /// Errors of operations whose code `error_code` does not read (table creation) keep no code, as
    /// before; a missing table has its own code.
    #[test]
    fn other_operations_and_a_missing_table_report_as_before() {
        let error = CreateTableError::generic(
            ErrorMetadata::builder()
                .code("LimitExceededException")
                .build(),
        );
        let other = store_error("t", SdkError::service_error(error, response(400)));
        assert!(matches!(other, StoreError::Other(_)), "{other:?}");
        assert_eq!(other.code(), None);
        let missing = store_error("t", update_error("ResourceNotFoundException", 400));
        assert!(matches!(&missing, StoreError::TableNotFound(t) if t == "t"));
        assert_eq!(missing.code(), Some("ResourceNotFoundException"));
    }
}
