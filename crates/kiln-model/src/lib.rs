//! Gemma 2/3/4 model description and device-agnostic forward pass.
