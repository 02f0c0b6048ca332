//! Differential test against Valgrind 3.19: the same binaries, single-stepped through the
//! interpreter by `tests/tracer` and run under `valgrind`, must give the same definedness
//! reports (kinds, and the functions of the program's own frames). Skipped, saying so, where
//! gcc or valgrind is missing.

mod tracer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use oxgrind_vbits::Check;

const UNINIT: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) int f(int x) { if (x > 3) return 1; return 0; }
int main(void) {
    int x;
    int *h = malloc(10 * sizeof(int));
    if (f(x)) puts("a");          /* uninitialised local, branch in f */
    if (h[3] == 7) puts("b");      /* uninitialised heap word */
    int idx = h[5] & 3;
    printf("%d\n", h[idx]);        /* undefined address, then printf of an undefined int */
    free(h);
    return 0;
}
"#;

const CLEAN: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct s { char c; int i; short h; };
static int cmp(const void *a, const void *b) { return *(const int*)a - *(const int*)b; }
int main(void) {
    char *p = malloc(100);
    strcpy(p, "hello, world");
    size_t n = strlen(p);
    char *q = malloc(64);
    memcpy(q, p, n + 1);
    if (strcmp(p, q) != 0 || strchr(q, 'w') == NULL) return 1;
    struct s a, b;
    a.c = 1; a.i = 2; a.h = 3;
    b = a;
    int v[50];
    for (int i = 0; i < 50; i++) v[i] = (i * 7919) % 101;
    qsort(v, 50, sizeof v[0], cmp);
    char buf[128];
    snprintf(buf, sizeof buf, "%s %zu %d %.3f %x", q, n, v[3], 3.14159 * v[10], b.i);
    puts(buf);
    printf("%g %ld\n", strtod("2.5e3", NULL), strtol("12345", NULL, 10));
    char *r = realloc(p, 1000);
    memset(r + 20, 'x', 100);
    r[120] = 0;
    printf("%zu\n", strlen(r + 20));
    free(r); free(q);
    return 0;
}
"#;

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn build(dir: &Path, name: &str, source: &str, opt: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let exe = dir.join(format!("{name}{opt}")); // uninit-O0
    let ok = Command::new("gcc")
        .args([opt, "-g", "-o"])
        .arg(&exe)
        .arg(&c)
        .status()
        .unwrap()
        .success();
    assert!(ok, "gcc failed on {name}");
    exe
}

/// (kind, function if the frame is in the program itself) -> count
type Kinds = BTreeMap<(String, String), usize>;

fn kind_of(check: Check) -> String {
    match check {
        Check::Condition => "Conditional jump or move depends on uninitialised value(s)".into(),
        Check::Value { size, .. } => format!("Use of uninitialised value of size {size}"),
    }
}

fn ours(exe: &Path) -> Option<Kinds> {
    let name = exe.file_name().unwrap().to_string_lossy().to_string();
    let t = tracer::trace(&[exe.to_string_lossy().to_string()], true);
    if t.steps == 0 {
        return None;
    }
    let mut out = Kinds::new();
    for r in t.reports {
        // "f+0xb (uninit-O0)"
        let in_program = r.place.ends_with(&format!("({name})"));
        let func = if in_program {
            r.place.split('+').next().unwrap_or("").to_string()
        } else {
            String::new()
        };
        *out.entry((kind_of(r.check), func)).or_default() += 1;
    }
    Some(out)
}

fn valgrind(exe: &Path) -> Kinds {
    let out = Command::new("valgrind")
        .args(["-q", "--error-limit=no"])
        .arg(exe)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    let exe_name = exe.file_name().unwrap().to_string_lossy().to_string();
    let file = format!("{}.c", exe_name.split('-').next().unwrap_or(""));
    let mut kinds = Kinds::new();
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.split_once("== ").map(|(_, r)| r).unwrap_or(l))
        .collect();
    for (i, line) in lines.iter().enumerate() {
        let kind = line.trim();
        if !(kind.starts_with("Conditional jump") || kind.starts_with("Use of uninitialised value"))
        {
            continue;
        }
        // "   at 0x109174: f (uninit.c:4)"
        let frame = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
        let func = frame.split(": ").nth(1).unwrap_or("");
        let in_program = func.contains(&format!("({file}:"));
        let name = if in_program {
            func.split(' ').next().unwrap_or("").to_string()
        } else {
            String::new()
        };
        *kinds.entry((kind.to_string(), name)).or_default() += 1;
    }
    kinds
}

#[test]
fn same_definedness_reports_as_valgrind_on_c_programs() {
    if !have("gcc") || !have("valgrind") {
        eprintln!("skipped: needs gcc and valgrind");
        return;
    }
    let dir = std::env::temp_dir().join(format!("oxgrind-vbits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, source, opt) in [
        ("uninit", UNINIT, "-O0"),
        ("uninit", UNINIT, "-O2"),
        ("clean", CLEAN, "-O2"),
    ] {
        let exe = build(&dir, name, source, opt);
        let Some(a) = ours(&exe) else {
            eprintln!("skipped: ptrace is not permitted here");
            return;
        };
        let b = valgrind(&exe);
        assert_eq!(
            a,
            b,
            "{}: ours (left) and Valgrind's (right) definedness reports differ",
            exe.display()
        );
        if name == "uninit" {
            assert!(
                a.values().sum::<usize>() >= 5,
                "the uninitialised cases must report: {a:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
