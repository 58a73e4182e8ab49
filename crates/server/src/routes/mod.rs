//! One module per protocol, each with its routes, handlers and the wire types they alone serve: the seed's
//! `/predict`, KServe v2, and the probes with `/metrics`. The app ([`crate::app`]) assembles them.

pub mod health;
pub mod predict;
pub mod v2;
