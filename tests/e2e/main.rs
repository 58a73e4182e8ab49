//! End-to-end: a real inferd on a loopback port, real ONNX Runtime and candle engines, the bundled models, and a
//! real HTTP client.

mod bad_input;
mod batching;
mod connections;
mod edge;
mod health;
mod ops;
mod predict;
mod repository;
mod shutdown;
mod tasks;
mod text;
