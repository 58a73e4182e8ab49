//! The operations every protocol shares, as plain functions below the routes: inference ([`infer`]), a model's
//! metadata, readiness and configuration ([`models`]), the repository's index and control ([`repository`]), and what
//! the text protocols share ([`text`]). An HTTP route and any other front end call the same function and differ only
//! in their wire types; the typed answers here serialise as KServe v2's JSON.

pub mod infer;
pub mod models;
pub mod repository;
pub mod text;
