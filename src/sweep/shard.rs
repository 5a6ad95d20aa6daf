//! `--shard i/n`: a deterministic split of a plan's units by their ids, so that n processes (or Slurm
//! array tasks) each run a disjoint part and together run every unit, whatever order they start in.

use std::fmt;
use std::str::FromStr;

/// Shard `index` (1-based) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// Whether the unit with this id (hex digits) belongs to this shard.
    pub fn contains(&self, unit_id: &str) -> bool {
        let h =
            u64::from_str_radix(unit_id.get(..16).unwrap_or(unit_id), 16).unwrap_or_else(|_| {
                // Not hex (never for kvbench's ids): hash the text instead.
                unit_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
                })
            });
        h % u64::from(self.count) == u64::from(self.index - 1)
    }

    /// The file-name tag, `shard-2-of-8`.
    pub fn tag(&self) -> String {
        format!("shard-{}-of-{}", self.index, self.count)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not a shard: write i/n with 1 <= i <= n, e.g. 2/8");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (u32, u32) = (
            i.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_units() {
        let ids: Vec<String> = (0..200u64)
            .map(|i| format!("{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .collect();
        let shards: Vec<Shard> = (1..=3).map(|i| format!("{i}/3").parse().unwrap()).collect();
        for id in &ids {
            assert_eq!(shards.iter().filter(|s| s.contains(id)).count(), 1, "{id}");
        }
        // Every shard gets some work.
        assert!(shards
            .iter()
            .all(|s| ids.iter().filter(|id| s.contains(id)).count() > 40));
        assert_eq!(shards[1].tag(), "shard-2-of-3");
        for bad in ["0/3", "4/3", "1", "a/b", "1/0"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }
}
