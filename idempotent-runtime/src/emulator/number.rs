//! [`Number`]: DynamoDB's `N` type, exact.
//!
//! DynamoDB numbers are decimals of up to 38 significant digits. An `i128` holds 38 digits, so a mantissa
//! and a power of ten represent every one of them exactly: comparisons and sums give what DynamoDB gives,
//! where `f64` would round `0.1 + 0.2` or large counters.

use std::cmp::Ordering;
use std::fmt;

/// Most significant digits of a DynamoDB number.
const MAX_DIGITS: usize = 38;

/// A DynamoDB number: `mantissa × 10^exponent`, normalized (no trailing zeros in the mantissa, zero has
/// exponent 0) so that numerically equal values are equal (`"1.50"` and `"1.5"`), and hash alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Number {
    mantissa: i128,
    exponent: i32,
}

impl Number {
    /// Parses DynamoDB's text form (`"42"`, `"-0.5"`, `"1.2E+3"`).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let invalid = || format!("`{text}` is not a number");
        let (negative, unsigned) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let (decimal, exponent) = match unsigned.find(['e', 'E']) {
            Some(at) => (
                &unsigned[..at],
                unsigned[at + 1..].parse::<i32>().map_err(|_| invalid())?,
            ),
            None => (unsigned, 0),
        };
        let (whole, fraction) = decimal.split_once('.').unwrap_or((decimal, ""));
        let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if whole.len() + fraction.len() == 0 || !all_digits(whole) || !all_digits(fraction) {
            return Err(invalid());
        }
        let fraction_len = i32::try_from(fraction.len()).map_err(|_| invalid())?;
        let digits = format!("{whole}{fraction}");
        let significant = digits.trim_start_matches('0');
        let trimmed = significant.trim_end_matches('0');
        if trimmed.len() > MAX_DIGITS {
            return Err(format!(
                "`{text}` has more than {MAX_DIGITS} significant digits"
            ));
        }
        let trailing_zeros =
            i32::try_from(significant.len() - trimmed.len()).map_err(|_| invalid())?;
        let magnitude: i128 = if trimmed.is_empty() {
            0
        } else {
            trimmed.parse().map_err(|_| invalid())?
        };
        let exponent = exponent
            .checked_sub(fraction_len)
            .and_then(|e| e.checked_add(trailing_zeros))
            .ok_or_else(invalid)?;
        let number = Self::normalized(if negative { -magnitude } else { magnitude }, exponent);
        // DynamoDB's range: magnitudes from 1E-130 to 9.99...E+125.
        if number.mantissa != 0 && !(-130..=125).contains(&number.leading_position()) {
            return Err(format!(
                "`{text}` is outside DynamoDB's range (1E-130 to 9.9E+125)"
            ));
        }
        Ok(number)
    }

    /// An integer.
    #[cfg(test)]
    pub(crate) fn from_i128(value: i128) -> Self {
        Self::normalized(value, 0)
    }

    fn normalized(mut mantissa: i128, mut exponent: i32) -> Self {
        if mantissa == 0 {
            return Self {
                mantissa: 0,
                exponent: 0,
            };
        }
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        Self { mantissa, exponent }
    }

    /// How many decimal digits the mantissa has.
    fn digits(self) -> i32 {
        // At most 39 digits fit in an i128, so the cast is lossless.
        self.mantissa
            .unsigned_abs()
            .checked_ilog10()
            .map_or(1, |d| d.cast_signed() + 1)
    }

    /// The power of ten of the leading digit (`0` for `5`, `2` for `123`, `-1` for `0.5`).
    fn leading_position(self) -> i32 {
        self.digits() - 1 + self.exponent
    }

    /// `self + other`, or `None` when the exact result needs more than 38 digits.
    pub(crate) fn checked_add(self, other: Self) -> Option<Self> {
        let exponent = self.exponent.min(other.exponent);
        let sum = scale(self.mantissa, self.exponent - exponent)?
            .checked_add(scale(other.mantissa, other.exponent - exponent)?)?;
        let result = Self::normalized(sum, exponent);
        usize::try_from(result.digits())
            .is_ok_and(|d| d <= MAX_DIGITS)
            .then_some(result)
    }

    /// `self - other`, or `None` when the exact result needs more than 38 digits.
    pub(crate) fn checked_sub(self, other: Self) -> Option<Self> {
        self.checked_add(Self {
            mantissa: -other.mantissa,
            exponent: other.exponent,
        })
    }
}

/// `mantissa × 10^by`, or `None` on overflow.
fn scale(mantissa: i128, by: i32) -> Option<i128> {
    mantissa.checked_mul(10i128.checked_pow(u32::try_from(by).ok()?)?)
}

impl Ord for Number {
    fn cmp(&self, other: &Self) -> Ordering {
        let by_sign = self.mantissa.signum().cmp(&other.mantissa.signum());
        if by_sign != Ordering::Equal || self.mantissa == 0 {
            return by_sign;
        }
        let by_magnitude = self
            .leading_position()
            .cmp(&other.leading_position())
            .then_with(|| {
                // Same leading digit position: shifting the one with the larger exponent down to the other's
                // gives it the other's digit count (at most 38), so the shift cannot overflow.
                let exponent = self.exponent.min(other.exponent);
                let a = scale(self.mantissa, self.exponent - exponent).map(i128::unsigned_abs);
                let b = scale(other.mantissa, other.exponent - exponent).map(i128::unsigned_abs);
                a.cmp(&b)
            });
        if self.mantissa > 0 {
            by_magnitude
        } else {
            by_magnitude.reverse()
        }
    }
}

impl PartialOrd for Number {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// DynamoDB's canonical text: no exponent, no trailing zeros (`"1500"`, `"-0.25"`).
impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.mantissa < 0 { "-" } else { "" };
        let digits = self.mantissa.unsigned_abs().to_string();
        if self.exponent >= 0 {
            let zeros = "0".repeat(self.exponent.unsigned_abs() as usize);
            return write!(f, "{sign}{digits}{zeros}");
        }
        let fraction_len = self.exponent.unsigned_abs() as usize;
        if fraction_len < digits.len() {
            let (whole, fraction) = digits.split_at(digits.len() - fraction_len);
            write!(f, "{sign}{whole}.{fraction}")
        } else {
            let zeros = "0".repeat(fraction_len - digits.len());
            write!(f, "{sign}0.{zeros}{digits}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(text: &str) -> Number {
        Number::parse(text).unwrap()
    }

    #[test]
    fn equal_values_in_different_spellings_are_equal() {
        assert_eq!(n("1.50"), n("1.5"));
        assert_eq!(n("1500"), n("1.5E3"));
        assert_eq!(n("+7"), n("7.000"));
        assert_eq!(n("0"), n("-0.0"));
        assert_eq!(n("0.05"), n("5e-2"));
    }

    #[test]
    fn orders_numerically_not_textually() {
        assert!(n("9") < n("10"));
        assert!(n("-10") < n("-9"));
        assert!(n("-1") < n("0"));
        assert!(n("0.1") < n("0.11"));
        assert!(n("0.999") < n("1"));
        assert!(n("99999999999999999999999999999999999999") > n("1E37"));
        assert!(n("1E100") > n("99999999999999999999999999999999999999"));
        assert!(n("1E-100") < n("1E-99"));
    }

    #[test]
    fn adds_and_subtracts_exactly() {
        assert_eq!(n("0.1").checked_add(n("0.2")), Some(n("0.3")));
        assert_eq!(n("10").checked_sub(n("3")), Some(n("7")));
        assert_eq!(n("3").checked_sub(n("10")), Some(n("-7")));
        assert_eq!(n("1.25").checked_sub(n("1.25")), Some(n("0")));
        assert_eq!(
            Number::from_i128(i128::from(u64::MAX)).checked_add(n("1")),
            Some(n("18446744073709551616"))
        );
    }

    #[test]
    fn refuses_results_beyond_38_digits() {
        let max = n("99999999999999999999999999999999999999");
        assert_eq!(max.checked_add(n("1")), Some(n("1E38")));
        assert_eq!(max.checked_add(n("0.1")), None);
        assert_eq!(n("1E100").checked_add(n("1")), None);
    }

    #[test]
    fn displays_the_canonical_text() {
        for (input, shown) in [
            ("1500", "1500"),
            ("1.5E3", "1500"),
            ("-0.250", "-0.25"),
            ("0.005", "0.005"),
            ("12.5", "12.5"),
            ("0", "0"),
        ] {
            assert_eq!(n(input).to_string(), shown);
        }
    }

    #[test]
    fn rejects_what_dynamodb_rejects() {
        for bad in ["", "-", "abc", "1.2.3", "1e", "1x", ".", "0x10"] {
            assert!(Number::parse(bad).is_err(), "{bad:?} parsed");
        }
        let err = Number::parse("123456789012345678901234567890123456789").unwrap_err();
        assert!(err.contains("38 significant digits"), "{err}");
        assert!(Number::parse("1E126").unwrap_err().contains("range"));
        assert!(Number::parse("1E-131").unwrap_err().contains("range"));
    }
}
