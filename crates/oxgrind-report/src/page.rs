//! The HTML page: the committed front-end bundle (`web/dist/`, rebuilt by `web/build.sh`), the
//! data as JSON in a `<script type="application/json">` element, nothing else.
//!
//! The page fetches nothing: its Content-Security-Policy forbids every network source, so a
//! report opened from file://, an e-mail or a CI artefact store looks the same everywhere and
//! cannot leak the profile's contents. The JSON writer escapes `<`, so the data cannot close
//! its script element.

const SCRIPT: &str = include_str!("../web/dist/report.js");
const STYLE: &str = include_str!("../web/dist/report.css");

/// A complete page showing `data` (the report or diff JSON).
pub fn html(title: &str, data_json: &str) -> String {
    let mut page = String::with_capacity(data_json.len() + SCRIPT.len() + STYLE.len() + 1024);
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    page.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n",
    );
    page.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    page.push_str("<meta name=\"generator\" content=\"oxgrind report\">\n<title>");
    page.push_str(&escape_html(title));
    page.push_str("</title>\n<style>");
    page.push_str(STYLE);
    page.push_str("</style>\n</head>\n<body>\n<header class=\"top\"><h1>oxgrind report</h1><span class=\"small\">");
    page.push_str(&escape_html(title));
    page.push_str("</span></header>\n<main id=\"app\"><noscript>This report needs JavaScript.</noscript></main>\n");
    page.push_str("<script id=\"oxgrind-data\" type=\"application/json\">");
    page.push_str(data_json);
    page.push_str("</script>\n<script>");
    page.push_str(SCRIPT);
    page.push_str("</script>\n</body>\n</html>\n");
    page
}

pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    /// web/build.sh records the hash of the sources it bundled: the committed bundle must
    /// come from the committed sources (run web/build.sh after editing web/src or style.css).
    #[test]
    fn committed_bundle_is_built_from_the_committed_sources() {
        let web = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("cat src/*.js style.css | sha256sum | cut -d' ' -f1")
            .current_dir(&web)
            .output()
            .expect("sh");
        let now = String::from_utf8(out.stdout).unwrap();
        let built = std::fs::read_to_string(web.join("dist/source.sha256")).unwrap();
        assert_eq!(
            now.trim(),
            built.trim(),
            "web/dist is stale: run crates/oxgrind-report/web/build.sh"
        );
    }

    #[test]
    fn bundle_cannot_close_its_own_script_element() {
        assert!(!super::SCRIPT.to_ascii_lowercase().contains("</script"));
        assert!(!super::STYLE.to_ascii_lowercase().contains("</style"));
    }
}
