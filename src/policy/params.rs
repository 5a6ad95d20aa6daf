//! Policy parameters as users write them: `--policy-arg key=value` on the command line, or a table of
//! keys in a TOML config. One reader serves both, so a parameter is defined (and checked) once.
//!
//! Every knob that differs between published implementations (GQA aggregation, softmax domain, query
//! reduction, pooling, kept order, trigger) is an explicit enum here, named as the spec names it.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Where a policy's parameters are written, for errors: a flag or a config's table.
const WHERE: &str = "--policy-arg, or `args` in a sweep config";

/// `key=value` pairs for one policy, read with typed getters that name the offending key on error and
/// refuse keys the policy does not know.
#[derive(Debug, Clone, Default)]
pub struct Params {
    policy: String,
    values: BTreeMap<String, String>,
    used: Vec<String>,
    /// The resolved value of every key read (defaults included), for reports and hashing.
    resolved: BTreeMap<String, String>,
}

impl Params {
    pub fn new(policy: &str, values: BTreeMap<String, String>) -> Self {
        Self {
            policy: policy.to_string(),
            values,
            used: Vec::new(),
            resolved: BTreeMap::new(),
        }
    }

    /// Parses `key=value` strings (the `--policy-arg` flag, repeatable).
    pub fn parse_pairs(pairs: &[String]) -> Result<BTreeMap<String, String>> {
        let mut values = BTreeMap::new();
        for pair in pairs {
            let Some((k, v)) = pair.split_once('=') else {
                return Err(Error::Input(format!(
                    "--policy-arg '{pair}': expected key=value"
                )));
            };
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() {
                return Err(Error::Input(format!("--policy-arg '{pair}': empty key")));
            }
            if values.insert(k.to_string(), v.to_string()).is_some() {
                return Err(Error::Input(format!(
                    "--policy-arg '{k}' is given more than once"
                )));
            }
        }
        Ok(values)
    }

    /// Reads `key` as `T`, or `default` when absent.
    pub fn get<T>(&mut self, key: &str, default: T) -> Result<T>
    where
        T: FromStr + fmt::Display,
        T::Err: fmt::Display,
    {
        self.used.push(key.to_string());
        if let Some(raw) = self.values.get(key) {
            check_number(raw).map_err(|why| {
                Error::Input(format!(
                    "policy '{}': {key}={raw} ({WHERE}): {why}",
                    self.policy
                ))
            })?;
        }
        let value = match self.values.get(key) {
            None => default,
            // Named values in any case (`mode=Prefill`, `gqa=Mean-Prob`), as the flags read names;
            // the resolved value is recorded as kvbench spells it.
            Some(raw) => raw.trim().to_ascii_lowercase().parse::<T>().map_err(|e| {
                Error::Input(format!(
                    "policy '{}': {key}={raw} ({WHERE}): {}{e}",
                    self.policy,
                    expected::<T>()
                ))
            })?,
        };
        self.resolved.insert(key.to_string(), value.to_string());
        Ok(value)
    }

    /// Reads a count that must be at least 1.
    pub fn positive(&mut self, key: &str, default: usize) -> Result<usize> {
        let v = self.get(key, default)?;
        if v == 0 {
            return Err(self.invalid(key, "must be at least 1"));
        }
        Ok(v)
    }

    /// An error about a key's value (for checks across keys).
    pub fn invalid(&self, key: &str, why: &str) -> Error {
        Error::Input(format!("policy '{}': {key} ({WHERE}): {why}", self.policy))
    }

    /// Fails on keys no getter asked for (typos must not be silently ignored).
    pub fn finish(&self) -> Result<BTreeMap<String, String>> {
        let unknown: Vec<&String> = self
            .values
            .keys()
            .filter(|k| !self.used.contains(k))
            .collect();
        if let Some(k) = unknown.first() {
            let mut known = self.used.clone();
            known.sort();
            known.dedup();
            return Err(Error::Input(format!(
                "policy '{}' has no parameter '{k}' ({WHERE}); it takes: {}",
                self.policy,
                known.join(", ")
            )));
        }
        Ok(self.resolved.clone())
    }
}

/// What a number's parse error leaves unsaid ("invalid digit found in string"): the kind of value
/// the key takes. Named values' errors list their names themselves.
fn expected<T>() -> &'static str {
    match std::any::type_name::<T>() {
        "usize" | "u64" | "u32" => "expected a whole number, 0 or more: ",
        "f64" | "f32" => "expected a number: ",
        _ => "",
    }
}

/// Refuses numbers no parameter can take, whatever its type: a whole number above the largest
/// budget (2^30; sizes, windows and counts derive bounds by adding to each other, which must not
/// overflow) and a value that is not finite (`nan`, `inf`).
fn check_number(raw: &str) -> std::result::Result<(), String> {
    let max = super::budget::MAX_ENTRIES;
    if raw.parse::<u128>().is_ok_and(|n| n > max as u128) {
        return Err(format!("at most {max} (2^30)"));
    }
    if raw.parse::<f64>().is_ok_and(|x| !x.is_finite()) {
        return Err("must be a finite number".into());
    }
    Ok(())
}

/// Defines a parameter enum with its spellings, parsing and display.
macro_rules! param_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $var:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($(#[$vdoc])* $var),+ }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s {
                    $($text => Ok(Self::$var),)+
                    _ => Err(format!("expected one of: {}", [$($text),+].join(", "))),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $(Self::$var => $text),+ })
            }
        }
    };
}

param_enum!(
    /// How the query heads of one GQA group are combined into one score per KV head.
    GqaAgg {
        /// Max over the group of raw logits, before the softmax (R-KV, its SnapKV).
        MaxLogit = "max-logit",
        /// Softmax per query head, then the sum over the group (RocketKV SnapKV++).
        SumProb = "sum-prob",
        /// Softmax per query head, then the mean over the group (KVCache-Factory).
        MeanProb = "mean-prob",
        /// No aggregation: keys and values are stored once per query head (the cache grows by the
        /// group size) and every query head selects its own entries (original SnapKV, LazyEviction).
        PerQueryHead = "per-query-head",
    }
);

param_enum!(
    /// Which keys the window softmax normalises over.
    SoftmaxDomain {
        /// Candidate keys only; window keys are left out of the denominator (R-KV).
        Candidates = "candidates",
        /// All keys, causal inside the window, then window columns dropped (SnapKV, RocketKV).
        AllCausal = "all-causal",
    }
);

param_enum!(
    /// How the window queries' probabilities are reduced to one score per entry.
    QueryReduce {
        Mean = "mean",
        Sum = "sum",
    }
);

param_enum!(
    /// The order kept entries are stored in after a compression.
    KeptOrder {
        /// Descending score, as `torch.topk` returns them (R-KV, SnapKV, LazyEviction references).
        Score = "score",
        /// Original positions, ascending (RocketKV, H2O, the R-KV serving ports).
        Positional = "positional",
    }
);

param_enum!(
    /// The kind of 1-D pooling along the cache axis (stride 1, padding `kernel / 2`).
    PoolKind {
        /// No pooling.
        None = "none",
        /// Max-pool; padding is −∞, so edges only see real neighbours.
        Max = "max",
        /// Average pool counting the zero padding (PyTorch's default), so edge scores shrink.
        Avg = "avg",
    }
);

param_enum!(
    /// When a policy compresses.
    Trigger {
        /// Every `buffer` generated tokens (and at prefill).
        EveryN = "every-n",
        /// After every step.
        EveryStep = "every-step",
    }
);

param_enum!(
    /// When a window-scored policy (SnapKV, PyramidKV, R-KV) compresses.
    WindowMode {
        /// At prefill and every `buffer` generated tokens (the R-KV repository's decode-time cadence).
        Decode = "decode",
        /// Once, at prefill, as the original SnapKV and PyramidKV; generated tokens are never evicted.
        Prefill = "prefill",
    }
);

param_enum!(
    /// How LazyEviction initialises a new entry's last-important step.
    LazyInit {
        /// `TS = t − 1` (the released code; reproduces the reported numbers).
        Code = "code",
        /// `TS = t`, the creation step (the paper's method figure).
        Paper = "paper",
    }
);

param_enum!(
    /// Which of RocketKV's two code paths the budget split follows (spec §3(f)).
    RocketSplit {
        /// The accuracy (HF) path: capacity floored at `min(2·max_new, S)`, `r_dims` truncated.
        Hf = "hf",
        /// The efficiency (gpt-fast) path: no floor, `r_dims` rounded.
        GptFast = "gpt-fast",
    }
);

/// A pooling operation: kind and kernel width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    pub kind: PoolKind,
    pub kernel: usize,
}

impl Pool {
    pub const NONE: Pool = Pool {
        kind: PoolKind::None,
        kernel: 1,
    };

    pub fn max(kernel: usize) -> Self {
        Pool {
            kind: PoolKind::Max,
            kernel,
        }
    }
}

/// Written `max:7`, `avg:5` or `none`.
impl FromStr for Pool {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "none" {
            return Ok(Pool::NONE);
        }
        let (kind, k) = s
            .split_once(':')
            .ok_or_else(|| "expected none, max:K or avg:K (K odd)".to_string())?;
        let kind: PoolKind = kind.parse()?;
        let kernel: usize = k
            .parse()
            .map_err(|_| format!("kernel '{k}' is not a whole number"))?;
        if kernel > super::budget::MAX_ENTRIES {
            return Err(format!("kernel {kernel} is above 2^30"));
        }
        if kernel == 0 || kernel.is_multiple_of(2) {
            return Err(format!("kernel {kernel} must be odd (padding is kernel/2)"));
        }
        Ok(Pool { kind, kernel })
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            PoolKind::None => f.write_str("none"),
            kind => write!(f, "{kind}:{}", self.kernel),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_beyond_any_budget_or_not_finite_are_refused_by_key() {
        for (raw, why) in [
            ("18446744073709551615", "at most 1073741824"),
            ("1073741825", "at most 1073741824"),
            ("nan", "finite"),
            ("inf", "finite"),
            ("-inf", "finite"),
        ] {
            let mut p = Params::new("rkv", [("buffer".to_string(), raw.to_string())].into());
            let err = p.get("buffer", 128usize).unwrap_err().to_string();
            assert!(err.contains("buffer") && err.contains(why), "{raw}: {err}");
        }
        let mut p = Params::new(
            "rkv",
            [("buffer".to_string(), "1073741824".to_string())].into(),
        );
        assert_eq!(p.get("buffer", 128usize).unwrap(), 1 << 30);
        assert!("max:18446744073709551615".parse::<Pool>().is_err());
    }

    #[test]
    fn named_values_are_read_in_any_case_and_resolved_as_kvbench_spells_them() {
        let pairs = Params::parse_pairs(&[
            "gqa=Mean-Prob".into(),
            "pool=MAX:5".into(),
            "mode=Prefill".into(),
        ])
        .unwrap();
        let spec = super::super::PolicySpec::new("snapkv", 64.0, pairs).unwrap();
        let r = spec.resolved();
        assert_eq!(r["gqa"], "mean-prob");
        assert_eq!(r["pool"], "max:5");
        assert_eq!(r["mode"], "prefill");
        let mut p = Params::new(
            "rkv",
            [("gqa".to_string(), "Mean-Probs".to_string())].into(),
        );
        let err = p.get("gqa", GqaAgg::MaxLogit).unwrap_err().to_string();
        assert!(
            err.contains("gqa=Mean-Probs") && err.contains("mean-prob"),
            "{err}"
        );
    }

    #[test]
    fn unknown_and_malformed_keys_are_named() {
        let pairs = Params::parse_pairs(&["window=8".into(), "lamda=0.1".into()]).unwrap();
        let mut p = Params::new("rkv", pairs);
        assert_eq!(p.get("window", 4usize).unwrap(), 8);
        let err = p.finish().unwrap_err().to_string();
        assert!(err.contains("'lamda'") && err.contains("window"), "{err}");

        let mut p = Params::new(
            "rkv",
            Params::parse_pairs(&["window=eight".into()]).unwrap(),
        );
        let err = p.get("window", 4usize).unwrap_err().to_string();
        assert!(err.contains("window=eight"), "{err}");
        // What the key takes, not only the parser's words.
        assert!(err.contains("a whole number"), "{err}");
        let mut p = Params::new("rkv", Params::parse_pairs(&["window=-3".into()]).unwrap());
        let err = p.get("window", 4usize).unwrap_err().to_string();
        assert!(
            err.contains("window=-3") && err.contains("a whole number"),
            "{err}"
        );
        let mut p = Params::new("rkv", Params::parse_pairs(&["lambda=x".into()]).unwrap());
        let err = p.get("lambda", 0.1f64).unwrap_err().to_string();
        assert!(err.contains("expected a number"), "{err}");
        assert!(Params::parse_pairs(&["window".into()]).is_err());
        assert!(Params::parse_pairs(&["a=1".into(), "a=2".into()]).is_err());
    }

    #[test]
    fn enums_and_pools_round_trip() {
        for s in ["max-logit", "sum-prob", "mean-prob", "per-query-head"] {
            assert_eq!(s.parse::<GqaAgg>().unwrap().to_string(), s);
        }
        assert_eq!("max:7".parse::<Pool>().unwrap(), Pool::max(7));
        assert_eq!("avg:5".parse::<Pool>().unwrap().to_string(), "avg:5");
        assert!("max:4".parse::<Pool>().is_err());
        assert!("median:3".parse::<Pool>().is_err());
    }
}
