//! A small JSON writer: the page's embedded data, `--format=json` and SARIF.
//!
//! Hand-written rather than serde: the outputs are built by walking our models once, and the
//! writer must also make the text safe inside an HTML `<script>` element, so `<`, `>` and `&`
//! (and U+2028/U+2029, which old JavaScript parsers treat as line ends) are always written as
//! `\u` escapes. Commas are placed by the writer, so callers only say what comes next.

use std::fmt::Write;

#[derive(Default)]
pub struct JsonOut {
    out: String,
    /// One entry per open object or array: whether nothing has been written in it yet.
    first: Vec<bool>,
    /// A key was just written: the next value needs no separator.
    after_key: bool,
}

impl JsonOut {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn finish(self) -> String {
        self.out
    }

    fn sep(&mut self) {
        if self.after_key {
            self.after_key = false;
            return;
        }
        if let Some(first) = self.first.last_mut() {
            if !*first {
                self.out.push(',');
            }
            *first = false;
        }
    }

    pub fn obj(&mut self) -> &mut Self {
        self.sep();
        self.out.push('{');
        self.first.push(true);
        self
    }

    pub fn end_obj(&mut self) -> &mut Self {
        self.first.pop();
        self.out.push('}');
        self
    }

    pub fn arr(&mut self) -> &mut Self {
        self.sep();
        self.out.push('[');
        self.first.push(true);
        self
    }

    pub fn end_arr(&mut self) -> &mut Self {
        self.first.pop();
        self.out.push(']');
        self
    }

    pub fn key(&mut self, k: &str) -> &mut Self {
        self.sep();
        escape_into(&mut self.out, k);
        self.out.push(':');
        self.after_key = true;
        self
    }

    pub fn str(&mut self, v: &str) -> &mut Self {
        self.sep();
        escape_into(&mut self.out, v);
        self
    }

    pub fn opt_str(&mut self, v: Option<&str>) -> &mut Self {
        match v {
            Some(s) => self.str(s),
            None => self.null(),
        }
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.sep();
        let _ = write!(self.out, "{v}");
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.sep();
        let _ = write!(self.out, "{v}");
        self
    }

    /// A finite number (non-finite ones become `null`, which JSON has instead).
    pub fn f64(&mut self, v: f64) -> &mut Self {
        self.sep();
        if v.is_finite() {
            let _ = write!(self.out, "{v}");
        } else {
            self.out.push_str("null");
        }
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.sep();
        self.out.push_str(if v { "true" } else { "false" });
        self
    }

    pub fn null(&mut self) -> &mut Self {
        self.sep();
        self.out.push_str("null");
        self
    }

    /// `"k": "v"` in one call.
    pub fn field_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.key(k).str(v)
    }

    pub fn field_u64(&mut self, k: &str, v: u64) -> &mut Self {
        self.key(k).u64(v)
    }
}

fn escape_into(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_and_escapes() {
        let mut j = JsonOut::new();
        j.obj().field_str("a", "x\"</script>\n").key("b").arr();
        j.u64(1).i64(-2).f64(0.5).f64(f64::NAN).bool(true).null();
        j.obj().end_obj().end_arr().end_obj();
        assert_eq!(
            j.finish(),
            r#"{"a":"x\"\u003c/script\u003e\n","b":[1,-2,0.5,null,true,null,{}]}"#
        );
    }
}
