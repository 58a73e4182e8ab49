use object_store::memory::InMemory;
use object_store::ObjectStoreExt;

use super::*;

const LIMITS: RemoteLimits = RemoteLimits { max_bytes: 1 << 20, max_files: 100, parallel: 2 };

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

async fn put(store: &InMemory, name: &str, bytes: &[u8]) {
    store.put(&Path::from(name), bytes.to_vec().into()).await.expect("put");
}

fn repository(store: &Arc<InMemory>, cache: &FsPath, limits: RemoteLimits) -> RemoteRepository {
    let store: Arc<dyn ObjectStore> = store.clone();
    RemoteRepository::with_store(store, Path::from("models"), "memory:///models", cache.to_path_buf(), limits)
}

/// Every file under `dir`, relative, with its bytes.
fn files(dir: &FsPath) -> BTreeMap<String, Vec<u8>> {
    fn walk(dir: &FsPath, relative: &str, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("reads") {
            let entry = entry.expect("entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if relative.is_empty() { name } else { format!("{relative}/{name}") };
            if entry.path().is_dir() {
                walk(&entry.path(), &path, out);
            } else {
                out.insert(path, std::fs::read(entry.path()).expect("reads"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out);
    out
}

#[test]
fn the_mirror_downloads_what_changed_and_removes_what_went() {
    runtime().block_on(async {
        let store = Arc::new(InMemory::new());
        put(&store, "models/digits/model.toml", b"backend = \"onnx\"\n").await;
        put(&store, "models/digits/1/model.onnx", b"one").await;
        put(&store, "elsewhere/x", b"not under the prefix").await;
        let cache = tempfile::tempdir().expect("tempdir");
        let remote = repository(&store, cache.path(), LIMITS);

        let first = remote.sync().await.expect("syncs");
        assert_eq!((first.files, first.bytes, first.downloaded_files, first.removed), (2, 20, 2, 0));
        let mirrored = files(&remote.mirror());
        assert_eq!(mirrored.keys().collect::<Vec<_>>(), ["digits/1/model.onnx", "digits/model.toml"]);
        assert_eq!(mirrored["digits/1/model.onnx"], b"one");

        // Nothing changed: nothing is downloaded, as after a restart with the cache warm.
        let again = repository(&store, cache.path(), LIMITS).sync().await.expect("syncs");
        assert_eq!((again.downloaded_files, again.downloaded_bytes), (0, 0));

        // A new version, a changed file, and a version gone.
        put(&store, "models/digits/2/model.onnx", b"two").await;
        put(&store, "models/digits/model.toml", b"backend = \"onnx\"\nversion_policy = \"all\"\n").await;
        store.delete(&Path::from("models/digits/1/model.onnx")).await.expect("deletes");
        let changed = remote.sync().await.expect("syncs");
        assert_eq!((changed.downloaded_files, changed.removed), (2, 1));
        let mirrored = files(&remote.mirror());
        assert_eq!(mirrored.keys().collect::<Vec<_>>(), ["digits/2/model.onnx", "digits/model.toml"]);
        assert!(!remote.mirror().join("digits/1").exists(), "an emptied folder is removed");
        assert!(!cache.path().join(format!("{PARTIAL}-{}", std::process::id())).exists());

        // A file of the mirror changed on disk (cut short, say) is downloaded again.
        std::fs::write(remote.mirror().join("digits/2/model.onnx"), b"t").expect("writes");
        let mended = remote.sync().await.expect("syncs");
        assert_eq!(mended.downloaded_files, 1);
        assert_eq!(files(&remote.mirror())["digits/2/model.onnx"], b"two");
    });
}

#[test]
fn a_repository_over_its_limits_is_refused_before_anything_downloads() {
    runtime().block_on(async {
        let store = Arc::new(InMemory::new());
        for n in 0..5 {
            put(&store, &format!("models/m/{n}.bin"), &[0; 100]).await;
        }
        let cache = tempfile::tempdir().expect("tempdir");
        let few = RemoteLimits { max_files: 4, ..LIMITS };
        let error = repository(&store, cache.path(), few).sync().await.expect_err("too many files");
        assert!(error.to_string().contains("more than 4 files (--max-repository-files)"), "{error}");
        let small = RemoteLimits { max_bytes: 499, ..LIMITS };
        let error = repository(&store, cache.path(), small).sync().await.expect_err("too many bytes");
        assert!(
            error.to_string().contains("holds 500 bytes in 5 files, more than --max-repository-bytes 499"),
            "{error}"
        );
        assert!(!cache.path().join(MIRROR).exists(), "nothing downloaded");
    });
}

#[test]
fn names_a_file_system_cannot_hold_are_skipped() {
    runtime().block_on(async {
        let store = Arc::new(InMemory::new());
        put(&store, "models/m/model.toml", b"x").await;
        put(&store, &format!("models/m/{}", "a".repeat(300)), b"long").await;
        put(&store, "models/m/1", b"a file where a folder is").await;
        put(&store, "models/m/1/model.onnx", b"y").await;
        let cache = tempfile::tempdir().expect("tempdir");
        let remote = repository(&store, cache.path(), LIMITS);
        let report = remote.sync().await.expect("syncs");
        assert_eq!(report.skipped.len(), 2, "{:?}", report.skipped);
        assert!(report.skipped[0].contains("a name of 300 bytes"), "{:?}", report.skipped);
        assert!(report.skipped[1].contains("also a folder"), "{:?}", report.skipped);
        assert_eq!(files(&remote.mirror()).keys().collect::<Vec<_>>(), ["m/1/model.onnx", "m/model.toml"]);
    });
}

/// An in-memory store whose downloads of `failing` fail, as a blob gone between the listing and its download.
#[derive(Debug)]
struct Failing {
    inner: InMemory,
    failing: std::sync::Mutex<Option<&'static str>>,
}

impl std::fmt::Display for Failing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Failing({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Failing {
    async fn put_opts(
        &self,
        location: &Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<object_store::GetResult> {
        if *self.failing.lock().expect("lock") == Some(location.as_ref()) {
            let source = "gone since the listing".into();
            return Err(object_store::Error::NotFound { path: location.to_string(), source });
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, object_store::Result<Path>>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: object_store::CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[test]
fn a_failed_download_leaves_no_partial_file_and_keeps_what_finished() {
    runtime().block_on(async {
        let inner = InMemory::new();
        put(&inner, "models/m/a.bin", b"a").await;
        put(&inner, "models/m/b.bin", b"b").await;
        let cache = tempfile::tempdir().expect("tempdir");
        let limits = RemoteLimits { parallel: 1, ..LIMITS };
        let store = Arc::new(Failing { inner, failing: std::sync::Mutex::new(Some("models/m/b.bin")) });
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let remote = RemoteRepository::with_store(
            dyn_store,
            Path::from("models"),
            "memory:///models",
            cache.path().into(),
            limits,
        );
        let error = remote.sync().await.expect_err("fails");
        assert!(format!("{error:#}").contains("cannot download models/m/b.bin"), "{error:#}");
        assert!(format!("{error:#}").contains("gone since the listing"), "{error:#}");
        let left: Vec<String> = std::fs::read_dir(cache.path())
            .expect("reads")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!left.iter().any(|name| name.starts_with(PARTIAL)), "no partial file left: {left:?}");
        assert_eq!(files(&remote.mirror()).keys().collect::<Vec<_>>(), ["m/a.bin"]);

        // Once the store serves it, only what did not finish is downloaded.
        *store.failing.lock().expect("lock") = None;
        let report = remote.sync().await.expect("syncs");
        assert_eq!(report.downloaded_files, 1);
    });
}

#[test]
fn a_file_that_became_a_folder_or_a_folder_that_became_a_file_is_replaced() {
    runtime().block_on(async {
        let store = Arc::new(InMemory::new());
        put(&store, "models/m/3", b"").await;
        put(&store, "models/m/x/y", b"y").await;
        let cache = tempfile::tempdir().expect("tempdir");
        let remote = repository(&store, cache.path(), LIMITS);
        remote.sync().await.expect("syncs");
        assert!(remote.mirror().join("m/3").is_file() && remote.mirror().join("m/x").is_dir());

        // `m/3` becomes a folder (a marker, then a file in it); `m/x` becomes a file.
        put(&store, "models/m/3/model.onnx", b"three").await;
        store.delete(&Path::from("models/m/3")).await.expect("deletes");
        store.delete(&Path::from("models/m/x/y")).await.expect("deletes");
        put(&store, "models/m/x", b"x").await;
        remote.sync().await.expect("syncs");
        let mirrored = files(&remote.mirror());
        assert_eq!(mirrored.keys().collect::<Vec<_>>(), ["m/3/model.onnx", "m/x"]);
    });
}

#[test]
fn an_empty_listing_is_refused_and_leaves_the_cache_as_it_was() {
    runtime().block_on(async {
        let store = Arc::new(InMemory::new());
        put(&store, "models/m/model.toml", b"x").await;
        let cache = tempfile::tempdir().expect("tempdir");
        let remote = repository(&store, cache.path(), LIMITS);
        remote.sync().await.expect("syncs");
        store.delete(&Path::from("models/m/model.toml")).await.expect("deletes");
        let error = remote.sync().await.expect_err("empty");
        assert!(error.to_string().contains("holds no files"), "{error}");
        assert!(remote.mirror().join("m/model.toml").is_file(), "the cache is untouched");
    });
}

#[test]
fn a_url_names_its_store() {
    assert!(is_remote("az://models/prefix") && is_remote("s3://bucket") && !is_remote("models/digits"));
    let cache = PathBuf::from("/nonexistent");
    let options = [("aws_region", "us-east-1")];
    let s3 = RemoteRepository::open("s3://bucket/repo", options, cache.clone(), LIMITS).expect("opens");
    assert_eq!((s3.url(), s3.prefix.as_ref()), ("s3://bucket/repo", "repo"));
    let account = [("azure_storage_account_key", "a2V5")];
    let blob = "https://account.blob.core.windows.net/container/some/prefix";
    let azure = RemoteRepository::open(blob, account, cache.clone(), LIMITS).expect("opens");
    assert_eq!(azure.prefix.as_ref(), "some/prefix");
    let error = RemoteRepository::open("ftp://host/x", [], cache.clone(), LIMITS).expect_err("no such store");
    assert!(format!("{error:#}").contains("cannot open the model repository ftp://host/x"), "{error:#}");
    let error =
        RemoteRepository::open("az://container/x?sv=1&sig=secret", [], cache.clone(), LIMITS).expect_err("query");
    assert!(error.to_string().contains("AZURE_STORAGE_SAS_TOKEN") && !error.to_string().contains("secret"), "{error}");
    let error = RemoteRepository::open("az://container/x", [], cache, LIMITS).expect_err("no account");
    assert!(format!("{error:#}").contains("az://container/x"), "{error:#}");
}

#[test]
fn a_sas_signature_never_reaches_a_message() {
    let said = redact_signatures("GET http://a/c?restype=container&sv=1&sig=abc%2Bdef&se=2 failed; sig=x");
    assert_eq!(said, "GET http://a/c?restype=container&sv=1&sig=***&se=2 failed; sig=***");
}
