//! The one budget rule every policy follows and every result reports.
//!
//! `--budget` at most 1 is a fraction of the full cache: after a compression the policy keeps at most
//! `ceil(fraction × tokens seen so far)` entries per layer and KV head. Above 1 it is an absolute
//! number of entries per layer and KV head. Either way a policy never goes below its always-kept set
//! (its observation window, its sink tokens): that floor is part of the policy's declared bound, and
//! so is its buffer (the entries it may accumulate between compressions). The engine checks the bound
//! after every step and fails loudly when a policy holds more.

use crate::error::{Error, Result};
use std::fmt;

/// A KV budget: a fraction of the tokens seen, or an absolute entry count per layer and head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    Fraction(f64),
    Entries(usize),
}

impl Budget {
    /// Reads the `--budget` value.
    pub fn from_value(value: f64) -> Result<Self> {
        if !value.is_finite() || value <= 0.0 {
            return Err(Error::Input(format!(
                "budget must be a positive number (--budget, or `budgets` in a sweep config), got {value}"
            )));
        }
        if value <= 1.0 {
            return Ok(Budget::Fraction(value));
        }
        if value.fract() != 0.0 {
            return Err(Error::Input(format!(
                "--budget {value}: above 1 the budget is a whole number of entries per layer and KV head"
            )));
        }
        Ok(Budget::Entries(value as usize))
    }

    /// Entries a policy may keep after compressing a sequence that has seen `seen` tokens.
    pub fn entries(&self, seen: usize) -> usize {
        match *self {
            Budget::Fraction(f) => (f * seen as f64).ceil() as usize,
            Budget::Entries(n) => n,
        }
    }

    /// The `--budget` number as written.
    pub fn value(&self) -> f64 {
        match *self {
            Budget::Fraction(f) => f,
            Budget::Entries(n) => n as f64,
        }
    }

    /// The rule in words, for reports.
    pub fn rule(&self) -> String {
        match *self {
            Budget::Fraction(f) => format!(
                "fraction {f}: at most ceil({f} × tokens seen) entries per layer and KV head after a compression, plus the policy's buffer"
            ),
            Budget::Entries(n) => format!(
                "absolute: at most {n} entries per layer and KV head after a compression, plus the policy's buffer"
            ),
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fraction_rounds_up_and_absolute_is_fixed() {
        let b = Budget::from_value(0.1).unwrap();
        assert_eq!(b.entries(1000), 100);
        assert_eq!(b.entries(1001), 101);
        assert_eq!(b.entries(0), 0);
        assert_eq!(Budget::from_value(1.0).unwrap().entries(37), 37);
        let b = Budget::from_value(256.0).unwrap();
        assert_eq!(b, Budget::Entries(256));
        assert_eq!(b.entries(10_000), 256);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 2.5] {
            assert!(Budget::from_value(bad).is_err(), "{bad}");
        }
    }
}
