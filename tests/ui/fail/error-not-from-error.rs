use idempotent_runtime::idempotent;

#[derive(Debug)]
enum PaymentError {
    Declined,
}

#[idempotent(key = order_id)]
async fn charge(order_id: u64) -> Result<u64, PaymentError> {
    if order_id == 0 {
        return Err(PaymentError::Declined);
    }
    Ok(order_id)
}

fn main() {}
