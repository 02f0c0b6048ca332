//! Placeholder until the ms_print renderer lands.
pub fn main(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("ms_print is not available in this build yet")
}
