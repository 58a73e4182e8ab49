//! Model versions: which numbered version folders (`1/`, `2/`, …) a model folder holds, and which of them
//! `version_policy` serves.

use std::path::Path;

use serde::{Deserialize, Deserializer};

use crate::error::Result;

/// Which of a model's numbered version folders (`1/`, `2/`, … Triton's layout) are served: `model.toml`'s
/// `version_policy = "latest"` (the default), `"all"`, `{ latest = N }` or `{ specific = [1, 3] }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionPolicy {
    /// The newest N.
    Latest(usize),
    All,
    Specific(Vec<u64>),
}

impl Default for VersionPolicy {
    fn default() -> Self {
        VersionPolicy::Latest(1)
    }
}

impl VersionPolicy {
    /// The versions served of those `available` (ascending).
    pub fn select(&self, available: &[u64]) -> Vec<u64> {
        match self {
            VersionPolicy::Latest(n) => available[available.len().saturating_sub(*n)..].to_vec(),
            VersionPolicy::All => available.to_vec(),
            VersionPolicy::Specific(wanted) => available.iter().copied().filter(|v| wanted.contains(v)).collect(),
        }
    }
}

impl<'de> Deserialize<'de> for VersionPolicy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            Latest { latest: usize },
            Specific { specific: Vec<u64> },
        }
        let expected = "version_policy: \"latest\", \"all\", { latest = N } or { specific = [versions] }";
        match Raw::deserialize(deserializer).map_err(|_| serde::de::Error::custom(expected))? {
            Raw::Word(w) if w == "latest" => Ok(VersionPolicy::Latest(1)),
            Raw::Word(w) if w == "all" => Ok(VersionPolicy::All),
            Raw::Latest { latest } if latest > 0 => Ok(VersionPolicy::Latest(latest)),
            Raw::Specific { specific } if !specific.is_empty() => Ok(VersionPolicy::Specific(specific)),
            _ => Err(serde::de::Error::custom(expected)),
        }
    }
}

/// The numbered version folders of a model folder, ascending: subfolders named by a positive integer.
pub(super) fn version_folders(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        // Only a number's own spelling: `03` would name version 3, whose files are looked for in `3/`.
        let version = name.to_str().and_then(|n| n.parse::<u64>().ok().filter(|v| v.to_string() == n));
        if let Some(v) = version.filter(|&v: &u64| v > 0) {
            if entry.path().is_dir() {
                versions.push(v);
            }
        }
    }
    versions.sort_unstable();
    Ok(versions)
}

#[cfg(test)]
mod tests {
    use crate::config::{ModelConfig, MODEL_CONFIG_FILE};

    #[test]
    fn numbered_folders_are_versions_chosen_by_the_policy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("detector");
        for v in ["1", "2", "10", "0", "x", "03"] {
            std::fs::create_dir_all(model.join(v)).expect("mkdir");
        }
        std::fs::write(model.join("7"), "a file, not a folder").expect("write");
        let write = |extra: &str| {
            std::fs::write(model.join(MODEL_CONFIG_FILE), format!("backend = \"onnx\"\nfile = \"m.onnx\"\n{extra}"))
                .expect("write")
        };
        let versions = |extra: &str| -> Vec<u64> {
            write(extra);
            ModelConfig::load_versions(&model).expect("valid").iter().map(|c| c.version).collect()
        };
        // `0`, `x`, `03` (not how 3 is written: its files would be looked for in `3/`) and the file `7` are not
        // versions.
        assert_eq!(versions(""), vec![10]);
        assert_eq!(versions("version_policy = \"all\""), vec![1, 2, 10]);
        assert_eq!(versions("version_policy = { latest = 2 }"), vec![2, 10]);
        assert_eq!(versions("version_policy = { specific = [2, 1, 99] }"), vec![1, 2]);
        let c = ModelConfig::load(&model).expect("valid");
        assert_eq!((c.name.as_str(), c.version), ("detector", 2));
        assert_eq!(c.file, model.join("2").join("m.onnx"), "the version's files are in its folder");
        assert_eq!(c.config_file, model.join(MODEL_CONFIG_FILE));
        write("version_policy = { specific = [5] }");
        let err = ModelConfig::load_versions(&model).expect_err("nothing selected").to_string();
        assert!(err.contains("none of the version folders [1, 2, 10]"), "{err}");
        for bad in ["\"newest\"", "{ latest = 0 }", "{ specific = [] }", "3"] {
            write(&format!("version_policy = {bad}"));
            let err = ModelConfig::load_versions(&model).expect_err("refused").to_string();
            assert!(err.contains("version_policy: \"latest\""), "{bad}: {err}");
        }
    }
}
