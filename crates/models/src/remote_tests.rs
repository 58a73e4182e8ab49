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
        assert!(!cache.path().join(PARTIAL).exists());

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

#[test]
fn a_failed_download_leaves_no_partial_file_and_keeps_what_finished() {
    runtime().block_on(async {
        let store = Arc::new(InMemory::new());
        put(&store, "models/m/a.bin", b"a").await;
        put(&store, "models/m/b.bin", b"b").await;
        let cache = tempfile::tempdir().expect("tempdir");
        let remote = repository(&store, cache.path(), RemoteLimits { parallel: 1, ..LIMITS });
        // A folder where `b.bin` must go: its rename fails, every time.
        std::fs::create_dir_all(remote.mirror().join("m/b.bin/inside")).expect("folder");
        let error = remote.sync().await.expect_err("fails");
        assert!(format!("{error:#}").contains("cannot download models/m/b.bin"), "{error:#}");
        assert!(!cache.path().join(PARTIAL).exists(), "no partial file left");
        assert_eq!(files(&remote.mirror()).keys().collect::<Vec<_>>(), ["m/a.bin"]);

        // Once the way is clear, only what did not finish is downloaded.
        std::fs::remove_dir_all(remote.mirror().join("m/b.bin")).expect("removes");
        let report = remote.sync().await.expect("syncs");
        assert_eq!(report.downloaded_files, 1);
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
    let error = RemoteRepository::open("az://container/x", [], cache, LIMITS).expect_err("no account");
    assert!(format!("{error:#}").contains("az://container/x"), "{error:#}");
}

#[test]
fn a_sas_signature_never_reaches_a_message() {
    let said = redact_signatures("GET http://a/c?restype=container&sv=1&sig=abc%2Bdef&se=2 failed; sig=x");
    assert_eq!(said, "GET http://a/c?restype=container&sv=1&sig=***&se=2 failed; sig=***");
}
