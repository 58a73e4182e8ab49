//! One module per protocol, each with its routes, handlers and the wire types they alone serve: the seed's
//! `/predict`, KServe v2, TEI's `/embed`, OpenAI's `/v1/embeddings`, and the probes with `/metrics`. The app
//! ([`crate::app`]) assembles them.

pub mod embed;
pub mod health;
pub mod openai;
pub mod predict;
pub mod v2;
