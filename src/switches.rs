//! The environment variables that turn a behaviour on or off, for diagnosis and for measuring one way
//! against another (listed in docs/commands.md). Each is read here, as 0 or 1, and the binary checks
//! them all before any command runs: a value that is neither is an error naming the variable (exit
//! 2), never silently on (as any value was, once, for the GPU's comparison switches: `=0` turned
//! them on).

/// One on/off variable: its name, what each setting does (for the error message) and its setting
/// when unset.
pub struct Switch {
    pub var: &'static str,
    off: &'static str,
    on: &'static str,
    default: bool,
}

/// Weight matrices repacked at load (1, the default) or kept as in the file (0).
pub const REPACK: Switch = Switch {
    var: "KVBENCH_REPACK",
    off: "rows as in the file",
    on: "repacked, the default",
    default: true,
};

/// The AVX-512 kernels' `vpdpbusd` where the CPU has it (1, the default), or never (0).
pub const VNNI: Switch = Switch {
    var: "KVBENCH_VNNI",
    off: "never vpdpbusd",
    on: "vpdpbusd where the CPU has it, the default",
    default: true,
};

/// A cached built-in model file hashed again at every start.
pub const VERIFY: Switch = Switch {
    var: "KVBENCH_VERIFY",
    off: "hashed once, when fetched, the default",
    on: "hashed again at every start",
    default: false,
};

/// On a GPU, H2O's and LazyEviction's policies called after each layer, not at the end of the step.
pub const POLICY_PER_LAYER: Switch = Switch {
    var: "KVBENCH_POLICY_PER_LAYER",
    off: "at the end of the step, the default",
    on: "after each layer",
    default: false,
};

/// On a GPU, a pooled batch's H2O scores kept on the host from every attention row.
pub const HOST_SCORES: Switch = Switch {
    var: "KVBENCH_HOST_SCORES",
    off: "on the device, the default",
    on: "on the host",
    default: false,
};

/// On a GPU, each sequence's compression scored and gathered on its own.
pub const COMPRESS_EACH: Switch = Switch {
    var: "KVBENCH_COMPRESS_EACH",
    off: "the batch's together, the default",
    on: "each sequence's on its own",
    default: false,
};

/// On a GPU, one sequence prefilled a pass.
pub const PREFILL_EACH: Switch = Switch {
    var: "KVBENCH_PREFILL_EACH",
    off: "several a pass, the default",
    on: "one a pass",
    default: false,
};

/// On a GPU, every step's logits copied to the host instead of greedy tokens chosen on the device.
pub const HOST_LOGITS: Switch = Switch {
    var: "KVBENCH_HOST_LOGITS",
    off: "greedy tokens chosen on the device, the default",
    on: "logits copied to the host",
    default: false,
};

/// Every switch, for the check at start.
pub const ALL: [&Switch; 8] = [
    &REPACK,
    &VNNI,
    &VERIFY,
    &POLICY_PER_LAYER,
    &HOST_SCORES,
    &COMPRESS_EACH,
    &PREFILL_EACH,
    &HOST_LOGITS,
];

impl Switch {
    /// The setting: `None` when unset, `Some` for 0 or 1 (spaces around ignored), else an error
    /// naming the variable, its value and what each setting means.
    pub fn read(&self) -> Result<Option<bool>, String> {
        self.parse(std::env::var_os(self.var))
    }

    fn parse(&self, value: Option<std::ffi::OsString>) -> Result<Option<bool>, String> {
        let Some(raw) = value else {
            return Ok(None);
        };
        match raw.to_str().map(str::trim) {
            Some("1") => Ok(Some(true)),
            Some("0") => Ok(Some(false)),
            _ => Err(format!(
                "{}={raw:?} must be 0 ({}) or 1 ({})",
                self.var, self.off, self.on
            )),
        }
    }

    /// Whether the switch is on (its default when unset; a malformed value was refused at start).
    pub fn is_on(&self) -> bool {
        self.read().ok().flatten().unwrap_or(self.default)
    }
}

/// Every switch's setting checked: the first malformed one's error.
pub fn check_all() -> Result<(), String> {
    ALL.iter().try_for_each(|s| s.read().map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_0_and_1_are_settings() {
        let some = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(HOST_SCORES.parse(None), Ok(None));
        assert_eq!(HOST_SCORES.parse(some("1")), Ok(Some(true)));
        assert_eq!(HOST_SCORES.parse(some(" 0\n")), Ok(Some(false)));
        for bad in ["", "yes", "true", "on", "2", "01"] {
            let e = HOST_SCORES.parse(some(bad)).unwrap_err();
            assert!(
                e.starts_with(&format!(
                    "KVBENCH_HOST_SCORES={bad:?} must be 0 (on the device"
                )),
                "{e}"
            );
        }
        let names: std::collections::HashSet<_> = ALL.iter().map(|s| s.var).collect();
        assert_eq!(names.len(), ALL.len(), "a switch listed twice");
    }
}
