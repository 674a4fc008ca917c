//! Kubernetes resource quantities (`64Gi`, `512M`, `1e9`) as byte counts.

use crate::error::QuantityError;

/// Parses a non-negative Kubernetes quantity into bytes (fractions round up).
pub fn parse_bytes(q: &str) -> Result<u128, QuantityError> {
    let s = q.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    if s.starts_with('-') {
        return Err(QuantityError::Negative(q.to_string()));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(QuantityError::Malformed(q.to_string()));
    }
    let (mult, exp10): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "m" => (1, -3),
        s if s.starts_with(['e', 'E']) => {
            let e: i32 = s[1..]
                .parse()
                .map_err(|_| QuantityError::Malformed(q.to_string()))?;
            if !(-18..=18).contains(&e) {
                return Err(QuantityError::Malformed(q.to_string()));
            }
            (1, e)
        }
        _ => return Err(QuantityError::Malformed(q.to_string())),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    // Fixed point with 18 fractional digits keeps the arithmetic exact.
    let scale: u128 = 10u128.pow(18);
    let int_v: u128 = if int.is_empty() {
        0
    } else {
        int.parse()
            .map_err(|_| QuantityError::Malformed(q.to_string()))?
    };
    let mut frac_v: u128 = 0;
    if !frac.is_empty() {
        if frac.len() > 18 {
            return Err(QuantityError::Malformed(q.to_string()));
        }
        frac_v = frac
            .parse::<u128>()
            .map_err(|_| QuantityError::Malformed(q.to_string()))?
            * 10u128.pow(18 - frac.len() as u32);
    }
    let fixed = int_v
        .checked_mul(scale)
        .and_then(|v| v.checked_add(frac_v))
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| QuantityError::Malformed(q.to_string()))?;
    let fixed = if exp10 >= 0 {
        fixed
            .checked_mul(10u128.pow(exp10 as u32))
            .ok_or_else(|| QuantityError::Malformed(q.to_string()))?
    } else {
        fixed.div_ceil(10u128.pow((-exp10) as u32))
    };
    Ok(fixed.div_ceil(scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("64Gi").unwrap(), 64 << 30);
        assert_eq!(parse_bytes("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("512M").unwrap(), 512_000_000);
        assert_eq!(parse_bytes("1e3").unwrap(), 1000);
        assert_eq!(parse_bytes("100").unwrap(), 100);
        assert_eq!(parse_bytes("1500m").unwrap(), 2);
    }

    #[test]
    fn rejects_negative_and_junk() {
        assert!(matches!(
            parse_bytes("-1Gi"),
            Err(QuantityError::Negative(_))
        ));
        assert!(matches!(
            parse_bytes("lots"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            parse_bytes("1.2.3Gi"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            parse_bytes("5Qi"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(parse_bytes(""), Err(QuantityError::Empty)));
    }
}
