//! Output file-name templates: `%p`, `%n`, `%q{VAR}`, `%%` (formats.md §0.3).
//!
//! The same rules hold for `--log-file`, `--xml-file` and every tool's `--*-out-file`.
//! `%p` is expanded when the file is written, so a forked child writes its own file.

use oxgrind_tool::OptionError;

/// Checks a template's syntax without expanding it (the launcher's early check).
pub fn check(template: &str) -> Result<(), OptionError> {
    expand(template, 0, 0, &|_| Some(String::new()), "/").map(|_| ())
}

/// Expands `template`. `getenv` looks up `%q{VAR}`; `cwd` makes a relative result absolute.
pub fn expand(
    template: &str,
    pid: i32,
    seq: u32,
    getenv: &dyn Fn(&str) -> Option<String>,
    cwd: &str,
) -> Result<String, OptionError> {
    if template.starts_with('~') {
        return Err(OptionError(format!(
            "{template}: a leading '~' is not expanded (the shell did not expand it)"
        )));
    }
    let mut out = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('p') => out.push_str(&pid.to_string()),
            Some('n') => out.push_str(&seq.to_string()),
            Some('%') => out.push('%'),
            Some('q') => {
                if chars.next() != Some('{') {
                    return Err(OptionError(format!("{template}: expected '{{' after '%q'")));
                }
                let mut var = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(ch) => var.push(ch),
                        None => {
                            return Err(OptionError(format!(
                                "{template}: missing '}}' after '%q{{'"
                            )))
                        }
                    }
                }
                match getenv(&var) {
                    Some(v) => out.push_str(&v),
                    None => {
                        return Err(OptionError(format!(
                            "Environment variable '{var}' is not set"
                        )))
                    }
                }
            }
            _ => {
                return Err(OptionError(format!(
                    "{template}: expected 'p' or 'q' or '%' after '%'"
                )))
            }
        }
    }
    if out.is_empty() {
        return Err(OptionError("empty output file name".into()));
    }
    if !out.starts_with('/') {
        let sep = if cwd.ends_with('/') { "" } else { "/" };
        out = format!("{cwd}{sep}{out}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_expand_and_relative_names_become_absolute() {
        let env = |k: &str| (k == "JOB").then(|| "7".to_string());
        assert_eq!(
            expand("massif.out.%p", 42, 1, &env, "/tmp").unwrap(),
            "/tmp/massif.out.42"
        );
        assert_eq!(
            expand("/x/%q{JOB}-%n-%%", 1, 3, &env, "/tmp").unwrap(),
            "/x/7-3-%"
        );
    }

    #[test]
    fn bad_templates_are_errors() {
        let env = |_: &str| None;
        assert!(expand("a%x", 1, 1, &env, "/").is_err());
        assert!(expand("%q{NOPE}", 1, 1, &env, "/")
            .unwrap_err()
            .0
            .contains("'NOPE' is not set"));
        assert!(expand("~/x", 1, 1, &env, "/").is_err());
    }
}
