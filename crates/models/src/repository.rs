//! Discovery: the model folders a repository holds and the versions each serves, read from their `model.toml`s,
//! and the models that routes without a model name serve. Reads files only: loading is [`crate::loader`]'s.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use inferd_core::{ModelConfig, MODEL_CONFIG_FILE};

use crate::task::{registration, Service};

/// A model repository: a folder of model folders, or one model folder.
#[derive(Debug, Clone)]
pub struct Repository {
    dir: PathBuf,
}

/// What a model folder holds, as poll mode compares it: a digest of the files its versions share (`model.toml`, a
/// tokenizer) and one of each version folder's files, from their names, sizes and modification times (a file
/// rewritten with the same size within the same instant goes unnoticed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FolderStamp {
    shared: u64,
    versions: BTreeMap<u64, u64>,
}

impl FolderStamp {
    /// Whether version `version`'s files differ between `before` and `self`.
    pub fn changed(&self, before: &FolderStamp, version: u64) -> bool {
        self.shared != before.shared || self.versions.get(&version) != before.versions.get(&version)
    }

    /// Reads `dir`: blocking. A file that cannot be read changes the stamp as it comes and goes.
    fn of(dir: &Path) -> FolderStamp {
        let mut shared = std::hash::DefaultHasher::new();
        let mut versions = BTreeMap::new();
        for (name, path) in sorted_entries(dir) {
            match name.parse::<u64>() {
                Ok(version) if path.is_dir() => {
                    let mut digest = std::hash::DefaultHasher::new();
                    digest_files(&path, &mut digest);
                    versions.insert(version, digest.finish());
                }
                _ => {
                    name.hash(&mut shared);
                    digest_files(&path, &mut shared);
                }
            }
        }
        FolderStamp { shared: shared.finish(), versions }
    }
}

/// The entries of `dir` by name, sorted; none where it cannot be read.
fn sorted_entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut entries: Vec<(String, PathBuf)> =
        entries.filter_map(|e| e.ok()).map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())).collect();
    entries.sort();
    entries
}

/// How deep [`digest_files`] goes: links are followed (a model folder may link its files), so a link to a folder
/// above would otherwise never end.
const MAX_DEPTH: usize = 8;

/// Feeds `path` (a file, or a folder's files, deeply) into `digest`: names, sizes, modification times.
fn digest_files(path: &Path, digest: &mut impl Hasher) {
    digest_within(path, digest, MAX_DEPTH);
}

fn digest_within(path: &Path, digest: &mut impl Hasher, depth: usize) {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() && depth > 0 => {
            for (name, inner) in sorted_entries(path) {
                name.hash(digest);
                digest_within(&inner, digest, depth - 1);
            }
        }
        Ok(meta) => (meta.len(), meta.modified().ok()).hash(digest),
        Err(_) => 0u8.hash(digest),
    }
}

/// The models that the routes without a model name serve.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Defaults {
    /// `/predict`: `--default-model`, or the only model.
    pub model: Option<String>,
    /// Each text service's: `--default-embed-model` for [`Service::Embed`], or the default model when it serves it,
    /// or the only model that serves it. A service with none is absent.
    pub services: Vec<(Service, String)>,
    /// TEI's `POST /` and `/info`: the default model when it takes texts; or else the default embedder, where the
    /// repository has embedders (none where it has several and none is chosen, as for `/embed`); or else the only
    /// text model.
    pub text: Option<String>,
}

impl Repository {
    pub fn new(dir: impl Into<PathBuf>) -> Repository {
        Repository { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads every model's `model.toml`, and returns each version to serve, sorted by name and version. A broken
    /// `model.toml` is an error that names the file and the field; a folder without one is skipped.
    pub fn discover(&self) -> anyhow::Result<Vec<ModelConfig>> {
        let dir = &self.dir;
        if dir.join(MODEL_CONFIG_FILE).is_file() {
            return Ok(ModelConfig::load_versions(dir)?);
        }
        let entries = std::fs::read_dir(dir)
            .map_err(|e| anyhow::anyhow!("cannot read the model repository {}: {e}", dir.display()))?;
        let mut configs = Vec::new();
        for entry in entries {
            let path = entry?.path();
            if path.join(MODEL_CONFIG_FILE).is_file() {
                configs.extend(ModelConfig::load_versions(&path)?);
            } else if path.is_dir() {
                tracing::debug!(folder = %path.display(), "no model.toml: not a model");
            }
        }
        if configs.is_empty() {
            anyhow::bail!("no models in {}: each model is a folder holding a model.toml", dir.display());
        }
        configs.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
        Ok(configs)
    }

    /// The folder of model `name`, if the repository has one (a repository that is one model folder has that
    /// one). Names that could leave the repository (`..`, a path) have none.
    pub fn model_folder(&self, name: &str) -> Option<PathBuf> {
        if self.dir.join(MODEL_CONFIG_FILE).is_file() {
            return (self.dir.file_name().and_then(|n| n.to_str()) == Some(name)).then(|| self.dir.clone());
        }
        let plain = !name.is_empty()
            && !name.starts_with('.')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        let dir = self.dir.join(name);
        (plain && dir.join(MODEL_CONFIG_FILE).is_file()).then_some(dir)
    }

    /// The names of the repository's model folders, sorted; none where the folder cannot be read.
    pub fn model_folders(&self) -> Vec<String> {
        if self.dir.join(MODEL_CONFIG_FILE).is_file() {
            return self.dir.file_name().and_then(|n| n.to_str()).map(str::to_owned).into_iter().collect();
        }
        sorted_entries(&self.dir)
            .into_iter()
            .filter(|(_, path)| path.join(MODEL_CONFIG_FILE).is_file())
            .map(|(name, _)| name)
            .collect()
    }

    /// Each model folder's stamp, by name (see [`FolderStamp`]). Reads the folders: blocking.
    pub fn stamps(&self) -> BTreeMap<String, FolderStamp> {
        self.model_folders()
            .into_iter()
            .filter_map(|name| Some((self.model_folder(&name).map(|dir| FolderStamp::of(&dir))?, name)))
            .map(|(stamp, name)| (name, stamp))
            .collect()
    }
}

impl Defaults {
    /// The defaults among `configs` (see [`Defaults`]): `default_model` must be one of them, and is the only one
    /// when not given; `default_embed_model` must be one of the embedders.
    pub fn choose(
        configs: &[ModelConfig],
        default_model: Option<&str>,
        default_embed_model: Option<&str>,
        repository: &Repository,
    ) -> anyhow::Result<Defaults> {
        let dir = repository.dir();
        let find = |name: &str| configs.iter().find(|c| c.name == name);
        let service = |c: &ModelConfig| registration(c).service;
        let model = match (default_model, configs) {
            (Some(name), _) if find(name).is_none() => {
                anyhow::bail!("--default-model `{name}` is not a model in {}", dir.display())
            }
            (Some(name), _) => Some(name.to_owned()),
            (None, [only, ..]) if configs.iter().all(|c| c.name == only.name) => Some(only.name.clone()),
            (None, _) => None,
        };
        // The models (by name, a model's versions once) that `serves` says yes to.
        let names = |serves: &dyn Fn(Service) -> bool| {
            let mut names: Vec<&str> = configs.iter().filter(|c| serves(service(c))).map(|c| c.name.as_str()).collect();
            names.dedup();
            names
        };
        // The default model when it serves `wanted`, or else the only model that does.
        let of_service = |wanted: Service| match model.as_deref().and_then(find) {
            Some(c) if service(c) == wanted => Some(c.name.clone()),
            _ => match names(&|s| s == wanted).as_slice() {
                [only] => Some((*only).to_owned()),
                _ => None,
            },
        };
        let embed = match default_embed_model {
            Some(name) => match find(name) {
                Some(c) if service(c) == Service::Embed => Some(name.to_owned()),
                Some(_) => {
                    anyhow::bail!("--default-embed-model `{name}` does not embed text (its task is not `embed`)")
                }
                None => anyhow::bail!("--default-embed-model `{name}` is not a model in {}", dir.display()),
            },
            None => of_service(Service::Embed),
        };
        let mut services = Vec::new();
        for wanted in Service::ALL.into_iter().filter(|s| s.takes_text()) {
            let chosen = if wanted == Service::Embed { embed.clone() } else { of_service(wanted) };
            if let Some(name) = chosen {
                services.push((wanted, name));
            }
        }
        let text = match model.as_deref().and_then(find) {
            Some(c) if service(c).takes_text() => Some(c.name.clone()),
            _ if !names(&|s| s == Service::Embed).is_empty() => embed,
            _ => match names(&Service::takes_text).as_slice() {
                [only] => Some((*only).to_owned()),
                _ => None,
            },
        };
        Ok(Defaults { model, services, text })
    }

    /// The default model of `service`, if there is one.
    pub fn of(&self, service: Service) -> Option<&str> {
        self.services.iter().find(|(s, _)| *s == service).map(|(_, name)| name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(repo: &Path, name: &str, toml: &str) {
        let dir = repo.join(name);
        std::fs::create_dir_all(&dir).expect("folder");
        std::fs::write(dir.join(MODEL_CONFIG_FILE), toml).expect("model.toml");
    }

    const TENSORS: &str = "backend = \"onnx\"\nfile = \"model.onnx\"\n";
    const TEXT: &str = "backend = \"candle\"\ntask = \"embed\"\n";

    #[test]
    fn discovery_reads_model_folders_sorted_and_skips_other_folders() {
        let repo = tempfile::tempdir().expect("tempdir");
        model(repo.path(), "b", TENSORS);
        model(repo.path(), "a", TENSORS);
        std::fs::create_dir(repo.path().join("notes")).expect("folder");
        let repository = Repository::new(repo.path());
        let names: Vec<String> = repository.discover().expect("discovers").into_iter().map(|c| c.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(repository.model_folders(), ["a", "b"]);
        assert!(repository.model_folder("a").is_some());
        for outside in ["notes", "..", "../a", "", ".hidden", "a/b"] {
            assert_eq!(repository.model_folder(outside), None, "{outside:?}");
        }
        let empty = tempfile::tempdir().expect("tempdir");
        let error = Repository::new(empty.path()).discover().expect_err("no models");
        assert!(error.to_string().contains("no models in"), "{error}");
    }

    #[test]
    fn a_stamp_changes_for_the_versions_whose_files_change() {
        let repo = tempfile::tempdir().expect("tempdir");
        model(repo.path(), "m", TENSORS);
        let write = |path: &str, bytes: &[u8]| {
            let path = repo.path().join("m").join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("folder");
            std::fs::write(path, bytes).expect("writes");
        };
        write("1/model.onnx", b"one");
        write("2/model.onnx", b"two");
        let repository = Repository::new(repo.path());
        let before = repository.stamps();
        assert_eq!(before.keys().collect::<Vec<_>>(), ["m"]);
        assert_eq!(repository.stamps(), before, "unchanged");

        write("2/model.onnx", b"two, again");
        write("3/model.onnx", b"three");
        let after = repository.stamps();
        let changed = |v| after["m"].changed(&before["m"], v);
        assert_eq!((changed(1), changed(2), changed(3)), (false, true, true));
        std::fs::remove_dir_all(repo.path().join("m/1")).expect("removes");
        assert!(repository.stamps()["m"].changed(&after["m"], 1), "a version gone");

        // A shared file changes every version.
        let before = repository.stamps();
        write("tokenizer.json", b"{}");
        let after = repository.stamps();
        assert!(after["m"].changed(&before["m"], 2) && after["m"].changed(&before["m"], 3));

        // A repository that is one model folder stamps that one.
        let one = Repository::new(repo.path().join("m"));
        assert_eq!(one.stamps().keys().collect::<Vec<_>>(), ["m"]);
        assert_eq!(one.model_folder("m"), Some(repo.path().join("m")));
        assert_eq!(one.model_folder("other"), None);
    }

    #[test]
    fn defaults_are_the_only_model_or_the_one_named_and_the_only_text_model() {
        let repo = tempfile::tempdir().expect("tempdir");
        model(repo.path(), "digits", TENSORS);
        let repository = Repository::new(repo.path());
        let configs = repository.discover().expect("discovers");
        let defaults = Defaults::choose(&configs, None, None, &repository).expect("defaults");
        assert_eq!(defaults, Defaults { model: Some("digits".into()), ..Defaults::default() });

        model(repo.path(), "minilm", TEXT);
        let configs = repository.discover().expect("discovers");
        let defaults = Defaults::choose(&configs, None, None, &repository).expect("defaults");
        let minilm = Some("minilm".to_owned());
        let embed = vec![(Service::Embed, "minilm".to_owned())];
        assert_eq!(defaults, Defaults { services: embed.clone(), text: minilm.clone(), ..Defaults::default() });
        let defaults = Defaults::choose(&configs, Some("minilm"), None, &repository).expect("defaults");
        assert_eq!(defaults, Defaults { model: minilm.clone(), services: embed.clone(), text: minilm.clone() });

        // One reranker and one classifier are the defaults of their services; TEI's `/` serves the embedder first.
        model(repo.path(), "ranker", "backend = \"candle\"\ntask = \"rerank\"\n");
        model(repo.path(), "sentiment", "backend = \"candle\"\ntask = \"classify\"\n");
        let configs = repository.discover().expect("discovers");
        let defaults = Defaults::choose(&configs, None, None, &repository).expect("defaults");
        assert_eq!((defaults.model.as_deref(), defaults.text.as_deref()), (None, Some("minilm")));
        assert_eq!(
            (defaults.of(Service::Rerank), defaults.of(Service::Classify), defaults.of(Service::TokenClassify)),
            (Some("ranker"), Some("sentiment"), None)
        );
        let defaults = Defaults::choose(&configs, Some("sentiment"), None, &repository).expect("defaults");
        assert_eq!(defaults.text.as_deref(), Some("sentiment"));

        // Two embedders and no choice: neither `/embed` nor `/` picks one, nor does `/` fall to the reranker.
        model(repo.path(), "mpnet", TEXT);
        let configs = repository.discover().expect("discovers");
        let defaults = Defaults::choose(&configs, None, None, &repository).expect("defaults");
        assert_eq!((defaults.of(Service::Embed), defaults.text.as_deref()), (None, None));
        let defaults = Defaults::choose(&configs, None, Some("mpnet"), &repository).expect("defaults");
        assert_eq!((defaults.of(Service::Embed), defaults.text.as_deref()), (Some("mpnet"), Some("mpnet")));

        let unknown = Defaults::choose(&configs, Some("nope"), None, &repository).expect_err("unknown");
        assert!(unknown.to_string().contains("--default-model `nope`"), "{unknown}");
        let not_text = Defaults::choose(&configs, None, Some("digits"), &repository).expect_err("not text");
        assert!(not_text.to_string().contains("does not embed text"), "{not_text}");
    }
}
