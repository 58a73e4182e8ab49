//! The operations every protocol shares, as plain functions below the routes: inference ([`infer`]), a model's
//! metadata, readiness and configuration ([`models`]), and the repository's index and control ([`repository`]).
//! An HTTP route and any other front end call the same function and differ only in their wire types; the typed
//! answers here serialise as KServe v2's JSON.

pub mod infer;
pub mod models;
pub mod repository;
