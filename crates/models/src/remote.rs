//! Repositories in an object store (Azure Blob Storage, S3): the objects under a URL's prefix mirrored into a local
//! cache folder, which is then served as a local repository. Files stream to disk, never whole in memory, several
//! at once; each is written under a temporary name and renamed into place only once it is whole (its size, and the
//! ETag the listing gave, which the download asks for), so the cache never holds half a file. A file whose ETag and
//! size the cache already holds is not downloaded again, and files the store no longer lists are removed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, ObjectMeta, ObjectStore};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

/// The folder of the cache that holds the mirror, served as the repository.
const MIRROR: &str = "repository";
/// The folder of the cache that holds downloads under way, one per process (`partial-<pid>`): two servers given the
/// same cache never write into each other's files.
const PARTIAL: &str = "partial";
/// The folder of the cache that names a mirror which is one model folder (see [`RemoteRepository::served`]).
const NAMED: &str = "named";
/// What the cache holds: each file's ETag and size, and where they came from.
const MANIFEST: &str = "manifest.json";
/// Tries per file, for errors that another try may mend (a connection reset, say).
const TRIES: u32 = 3;
/// The longest name a file system commonly takes for one part of a path.
const MAX_NAME_BYTES: usize = 255;

/// Whether `location` names a repository in an object store (a URL) rather than a folder.
pub fn is_remote(location: &str) -> bool {
    location.contains("://")
}

/// The bounds of a remote repository.
#[derive(Debug, Clone, Copy)]
pub struct RemoteLimits {
    /// All its files together, in bytes.
    pub max_bytes: u64,
    pub max_files: usize,
    /// Downloads at once.
    pub parallel: usize,
}

/// A repository in an object store, mirrored into a cache folder.
#[derive(Debug, Clone)]
pub struct RemoteRepository {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// The URL as given, for messages.
    url: String,
    cache: PathBuf,
    limits: RemoteLimits,
}

/// What one mirroring did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// The files the store lists under the prefix (those skipped left out), and their bytes.
    pub files: usize,
    pub bytes: u64,
    /// Those downloaded this time (the rest the cache held already).
    pub downloaded_files: usize,
    pub downloaded_bytes: u64,
    /// Files of the cache that the store no longer lists, removed.
    pub removed: usize,
    /// Names the file system cannot hold, skipped, each with why.
    pub skipped: Vec<String>,
}

/// One file the store lists: its path in the mirror, and what the store says of it.
#[derive(Debug, Clone)]
struct Listed {
    relative: String,
    meta: ObjectMeta,
}

/// What the cache holds: each file's ETag and size as downloaded.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Manifest {
    url: String,
    files: BTreeMap<String, Held>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Held {
    e_tag: Option<String>,
    size: u64,
}

impl RemoteRepository {
    /// The repository at `url` (`az://container/prefix`, `https://account.blob.core.windows.net/container/prefix`,
    /// `s3://bucket/prefix`), with the store's `options` (`azure_storage_account_key`, `aws_endpoint`, … as the
    /// `object_store` crate names them), mirrored into `cache`.
    pub fn open<'a>(
        url: &str,
        options: impl IntoIterator<Item = (&'a str, &'a str)>,
        cache: PathBuf,
        limits: RemoteLimits,
    ) -> anyhow::Result<RemoteRepository> {
        let parsed = url::Url::parse(url).with_context(|| format!("`{url}` is not a URL"))?;
        if parsed.query().is_some() {
            // A SAS token pasted into the URL would be printed wherever the URL is.
            anyhow::bail!(
                "the model repository's URL has a query (a SAS token?): give the token in AZURE_STORAGE_SAS_TOKEN \
                 instead, so that it is never logged"
            );
        }
        let (store, prefix) = object_store::parse_url_opts(&parsed, options)
            .with_context(|| format!("cannot open the model repository {url}"))?;
        Ok(RemoteRepository::with_store(Arc::from(store), prefix, url, cache, limits))
    }

    /// The repository under `prefix` in `store`.
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        url: &str,
        cache: PathBuf,
        limits: RemoteLimits,
    ) -> RemoteRepository {
        RemoteRepository { store, prefix, url: url.to_owned(), cache, limits }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The folder the mirror is in.
    pub fn mirror(&self) -> PathBuf {
        self.cache.join(MIRROR)
    }

    /// The folder to serve, once mirrored: the mirror; or, where the prefix is one model folder (a `model.toml` at
    /// its top), a link to the mirror named as the prefix's last part, so that the model is served under its own
    /// name, as a local model folder is. Blocking (a few file-system calls).
    pub fn served(&self) -> anyhow::Result<PathBuf> {
        let mirror = self.mirror();
        if !mirror.join(inferd_core::MODEL_CONFIG_FILE).is_file() {
            return Ok(mirror);
        }
        let name = self.prefix.parts().next_back().map(|p| p.as_ref().to_owned()).unwrap_or_else(|| "model".to_owned());
        let named = self.cache.join(NAMED);
        std::fs::create_dir_all(&named)?;
        let link = named.join(&name);
        if std::fs::read_link(&link).ok() != Some(mirror.clone()) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&mirror, &link)
                .with_context(|| format!("cannot link {} to the model cache", link.display()))?;
        }
        Ok(link)
    }

    /// Makes the mirror what the store holds now: lists the prefix, downloads what the cache lacks or holds
    /// another version of, and removes what the store no longer lists. A repository over its limits is refused
    /// before anything is downloaded. On an error, the files that finished stay (and are not downloaded again), and
    /// no half-written file is left.
    pub async fn sync(&self) -> anyhow::Result<SyncReport> {
        let mut report = SyncReport::default();
        let listed = self.list(&mut report).await?;
        if listed.is_empty() {
            // Refused before the cache is touched: a prefix emptied for a moment must not unload every model.
            anyhow::bail!("the model repository {} holds no files", self.url);
        }
        let mirror = self.mirror();
        let partial = self.cache.join(format!("{PARTIAL}-{}", std::process::id()));
        let _ = tokio::fs::remove_dir_all(&partial).await;
        tokio::fs::create_dir_all(&partial)
            .await
            .with_context(|| format!("cannot make the model cache folder {}", partial.display()))?;
        let mut manifest = self.manifest().await;
        let mut wanted = Vec::new();
        for file in &listed {
            let held = Held { e_tag: file.meta.e_tag.clone(), size: file.meta.size };
            let on_disk = tokio::fs::metadata(mirror.join(&file.relative)).await.map(|m| m.len()).ok();
            if manifest.files.get(&file.relative) != Some(&held) || on_disk != Some(file.meta.size) {
                manifest.files.remove(&file.relative);
                wanted.push(file.clone());
            }
        }
        let fetched = self.fetch_all(wanted, &partial, &mirror).await;
        for (file, held) in &fetched.done {
            report.downloaded_files += 1;
            report.downloaded_bytes += held.size;
            manifest.files.insert(file.clone(), held.clone());
        }
        let _ = tokio::fs::remove_dir_all(&partial).await;
        if let Some(error) = fetched.error {
            self.write_manifest(&manifest).await?;
            return Err(error);
        }
        let keep: BTreeSet<String> = listed.iter().map(|f| f.relative.clone()).collect();
        manifest.files.retain(|name, _| keep.contains(name));
        report.removed = remove_others(mirror, keep).await?;
        self.write_manifest(&manifest).await?;
        Ok(report)
    }

    /// The files under the prefix, checked against the limits; names a file system cannot hold are skipped.
    async fn list(&self, report: &mut SyncReport) -> anyhow::Result<Vec<Listed>> {
        let url = &self.url;
        let mut stream = self.store.list(Some(&self.prefix));
        let mut listed = Vec::new();
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(|e| anyhow::anyhow!("cannot list the model repository {url}: {}", said(&e)))?;
            if listed.len() == self.limits.max_files {
                anyhow::bail!(
                    "the model repository {url} holds more than {} files (--max-repository-files)",
                    self.limits.max_files
                );
            }
            let Some(parts) = meta.location.prefix_match(&self.prefix) else { continue };
            let parts: Vec<String> = parts.map(|p| p.as_ref().to_owned()).collect();
            match parts.iter().find(|p| p.len() > MAX_NAME_BYTES) {
                Some(long) => report.skipped.push(format!("`{}`: a name of {} bytes", meta.location, long.len())),
                None if parts.is_empty() => {}
                None => listed.push(Listed { relative: parts.join("/"), meta }),
            }
        }
        // A name that is also a folder of other names (`a` beside `a/b`, as some stores mark folders) cannot be both.
        let folders: BTreeSet<String> = listed
            .iter()
            .flat_map(|f| f.relative.match_indices('/').map(|(at, _)| f.relative[..at].to_owned()))
            .collect();
        let (clashing, listed): (Vec<Listed>, Vec<Listed>) =
            listed.into_iter().partition(|f| folders.contains(&f.relative));
        report.skipped.extend(
            clashing.iter().filter(|f| f.meta.size > 0).map(|f| format!("`{}`: also a folder", f.meta.location)),
        );
        for skipped in &report.skipped {
            tracing::warn!(repository = %url, blob = %skipped, "skipped: the file system cannot hold this name");
        }
        report.files = listed.len();
        report.bytes = listed.iter().fold(0u64, |sum, f| sum.saturating_add(f.meta.size));
        if report.bytes > self.limits.max_bytes {
            anyhow::bail!(
                "the model repository {url} holds {} bytes in {} files, more than --max-repository-bytes {}",
                report.bytes,
                report.files,
                self.limits.max_bytes
            );
        }
        Ok(listed)
    }

    /// Downloads `wanted`, `parallel` at a time, until one fails for good: the files done, and the first error.
    async fn fetch_all(&self, wanted: Vec<Listed>, partial: &FsPath, mirror: &FsPath) -> Fetched {
        let parallel = self.limits.parallel.max(1);
        let mut downloads = futures_util::stream::iter(wanted.into_iter().enumerate().map(|(n, file)| {
            let store = self.store.clone();
            let temporary = partial.join(n.to_string());
            let target = mirror.join(&file.relative);
            async move {
                let held = fetch(store.as_ref(), &file.meta, &temporary, &target, mirror).await;
                (file, held)
            }
        }))
        .buffer_unordered(parallel);
        let mut fetched = Fetched { done: Vec::new(), error: None };
        while let Some((file, held)) = downloads.next().await {
            match held {
                Ok(held) => fetched.done.push((file.relative, held)),
                Err(e) => {
                    let (blob, url) = (&file.meta.location, &self.url);
                    let cause: &(dyn std::error::Error + 'static) = e.as_ref();
                    fetched.error = Some(anyhow::anyhow!("cannot download {blob} from {url}: {}", said(cause)));
                    break;
                }
            }
        }
        fetched
    }

    /// The manifest the cache holds, if it is of this repository; an empty one otherwise.
    async fn manifest(&self) -> Manifest {
        let read = tokio::fs::read(self.cache.join(MANIFEST)).await.ok();
        match read.and_then(|bytes| serde_json::from_slice::<Manifest>(&bytes).ok()) {
            Some(manifest) if manifest.url == self.url => manifest,
            _ => Manifest { url: self.url.clone(), files: BTreeMap::new() },
        }
    }

    /// Writes the manifest whole, or not at all.
    async fn write_manifest(&self, manifest: &Manifest) -> anyhow::Result<()> {
        let path = self.cache.join(MANIFEST);
        let temporary = self.cache.join(format!("{MANIFEST}.partial"));
        let bytes = serde_json::to_vec(manifest)?;
        tokio::fs::write(&temporary, bytes).await?;
        tokio::fs::rename(&temporary, &path).await.with_context(|| format!("cannot write {}", path.display()))
    }
}

/// What a store's error says, on one line: each cause once (a store's error repeats its answer's body at several
/// levels), whitespace collapsed.
fn said(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.retain(|p| !text.contains(p.as_str()));
            parts.push(text);
        }
        next = e.source();
    }
    redact_signatures(&parts.join(": "))
}

/// `text` with the value of each URL's `sig=` parameter (a SAS token's signature, which a store's error may quote
/// in the URL it requested) replaced by `***`.
fn redact_signatures(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("sig=") {
        let value = at + "sig=".len();
        out.push_str(&rest[..value]);
        out.push_str("***");
        let end = rest[value..].find(|c: char| c == '&' || c.is_whitespace()).map_or(rest.len(), |n| value + n);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// What [`RemoteRepository::fetch_all`] got.
struct Fetched {
    done: Vec<(String, Held)>,
    error: Option<anyhow::Error>,
}

/// Downloads one file to `temporary`, then renames it to `target`; tries again where another try may mend it.
async fn fetch(
    store: &dyn ObjectStore,
    meta: &ObjectMeta,
    temporary: &FsPath,
    target: &FsPath,
    mirror: &FsPath,
) -> anyhow::Result<Held> {
    let mut tries = 0;
    loop {
        tries += 1;
        match fetch_once(store, meta, temporary, target, mirror).await {
            Ok(held) => return Ok(held),
            Err(e) => {
                let _ = tokio::fs::remove_file(temporary).await;
                let lasting = matches!(
                    e.downcast_ref::<object_store::Error>(),
                    Some(object_store::Error::NotFound { .. } | object_store::Error::Precondition { .. })
                );
                if lasting || tries == TRIES {
                    return Err(e);
                }
                let cause: &(dyn std::error::Error + 'static) = e.as_ref();
                tracing::warn!(blob = %meta.location, error = %said(cause), tries, "download failed; trying again");
                tokio::time::sleep(Duration::from_millis(250 << tries)).await;
            }
        }
    }
}

async fn fetch_once(
    store: &dyn ObjectStore,
    meta: &ObjectMeta,
    temporary: &FsPath,
    target: &FsPath,
    mirror: &FsPath,
) -> anyhow::Result<Held> {
    // The version listed, or an error: never a mix of the listed size and a newer version's bytes.
    let options = GetOptions { if_match: meta.e_tag.clone(), ..GetOptions::default() };
    let got = store.get_opts(&meta.location, options).await?;
    let mut file = tokio::fs::File::create(temporary).await?;
    let mut written = 0u64;
    let mut chunks = got.into_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        written += chunk.len() as u64;
        if written > meta.size {
            anyhow::bail!("the store sent more than the {} bytes it listed", meta.size);
        }
        file.write_all(&chunk).await?;
    }
    file.sync_all().await?;
    drop(file);
    if written != meta.size {
        anyhow::bail!("the store sent {written} of the {} bytes it listed", meta.size);
    }
    clear_the_way(mirror, target).await?;
    if let Some(folder) = target.parent() {
        tokio::fs::create_dir_all(folder).await?;
    }
    tokio::fs::rename(temporary, target).await?;
    Ok(Held { e_tag: meta.e_tag.clone(), size: meta.size })
}

/// Makes room for the file `target` under `mirror` where the store turned a file into a folder or back (`m/3`, a
/// folder marker, then `m/3/model.onnx`): a file where one of its folders goes, or a folder where it goes, is removed.
async fn clear_the_way(mirror: &FsPath, target: &FsPath) -> std::io::Result<()> {
    let Ok(relative) = target.strip_prefix(mirror) else { return Ok(()) };
    let mut path = mirror.to_path_buf();
    let parts: Vec<_> = relative.components().collect();
    for (n, part) in parts.iter().enumerate() {
        path.push(part);
        let Ok(meta) = tokio::fs::symlink_metadata(&path).await else { return Ok(()) };
        match (n + 1 == parts.len(), meta.is_dir()) {
            (true, true) => tokio::fs::remove_dir_all(&path).await?,
            (false, false) => tokio::fs::remove_file(&path).await?,
            _ => {}
        }
    }
    Ok(())
}

/// Removes every file under `mirror` that `keep` does not name (paths relative to it, `/` between parts), and the
/// folders left empty; returns how many files went. Blocking work, on the blocking pool.
async fn remove_others(mirror: PathBuf, keep: BTreeSet<String>) -> anyhow::Result<usize> {
    tokio::task::spawn_blocking(move || {
        fn walk(dir: &FsPath, relative: &str, keep: &BTreeSet<String>) -> std::io::Result<(usize, bool)> {
            let (mut removed, mut empty) = (0, true);
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let path = if relative.is_empty() { name.clone() } else { format!("{relative}/{name}") };
                if entry.file_type()?.is_dir() {
                    let (gone, left_empty) = walk(&entry.path(), &path, keep)?;
                    removed += gone;
                    if left_empty {
                        std::fs::remove_dir(entry.path())?;
                        continue;
                    }
                } else if !keep.contains(&path) {
                    std::fs::remove_file(entry.path())?;
                    removed += 1;
                    continue;
                }
                empty = false;
            }
            Ok((removed, empty))
        }
        std::fs::create_dir_all(&mirror)?;
        walk(&mirror, "", &keep).map(|(removed, _)| removed)
    })
    .await?
    .context("cannot tidy the model cache")
}

#[cfg(test)]
#[path = "remote_tests.rs"]
mod tests;
