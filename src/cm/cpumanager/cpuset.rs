//! A set of CPU ids in the Linux list form ("0-3,7"), as `k8s.io/utils/cpuset`
//! parses and prints it: the checkpoint and the CRI's `cpuset_cpus` both
//! carry this text, so it must match upstream's byte for byte.

use std::collections::BTreeSet;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid cpu id {0:?}")]
    Id(String),
    #[error("invalid range {0:?} ({1} > {2})")]
    Range(String, usize, usize),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<usize>);

impl CpuSet {
    pub fn new() -> Self {
        CpuSet::default()
    }

    /// Upstream `cpuset.Parse`: empty text is the empty set; elements are
    /// ids or `a-b` ranges separated by commas.
    pub fn parse(s: &str) -> Result<Self, ParseError> {
        let mut set = BTreeSet::new();
        if s.is_empty() {
            return Ok(CpuSet(set));
        }
        let id = |t: &str| {
            t.parse::<usize>()
                .map_err(|_| ParseError::Id(t.to_string()))
        };
        for part in s.split(',') {
            match part.split_once('-') {
                None => {
                    set.insert(id(part)?);
                }
                Some((a, b)) => {
                    let (a, b) = (id(a)?, id(b)?);
                    if a > b {
                        return Err(ParseError::Range(part.to_string(), a, b));
                    }
                    set.extend(a..=b);
                }
            }
        }
        Ok(CpuSet(set))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    pub fn insert(&mut self, cpu: usize) {
        self.0.insert(cpu);
    }

    /// Ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        CpuSet(iter.into_iter().collect())
    }
}

/// Upstream `CPUSet.String`: runs of consecutive ids as `a-b`, single ids
/// alone, comma-separated, ascending.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end = it.next().unwrap_or(end);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_linux_list_form() {
        for (text, ids) in [
            ("", vec![]),
            ("0", vec![0]),
            ("0-3,7", vec![0, 1, 2, 3, 7]),
            ("1,3,5", vec![1, 3, 5]),
            (
                "0-1,6-13,18-23",
                vec![0, 1, 6, 7, 8, 9, 10, 11, 12, 13, 18, 19, 20, 21, 22, 23],
            ),
        ] {
            let s = CpuSet::parse(text).unwrap();
            assert_eq!(s.iter().collect::<Vec<_>>(), ids, "{text}");
            assert_eq!(s.to_string(), text);
        }
        // Unordered and overlapping input is normalised.
        assert_eq!(CpuSet::parse("7,0-2,1").unwrap().to_string(), "0-2,7");
        assert!(CpuSet::parse("3-1").is_err());
        assert!(CpuSet::parse("a").is_err());
        assert!(CpuSet::parse("1,").is_err());
    }
}
