//! placeholder
use anyhow::Result;
pub fn main(_args: &[String]) -> Result<std::process::ExitCode> { anyhow::bail!("diff: not yet") }
