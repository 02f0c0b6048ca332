// Rust: threads, channels, HashMap churn and a caught panic.
use std::collections::HashMap;
use std::sync::mpsc;
use std::thread;

fn main() {
    let (tx, rx) = mpsc::channel();
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let tx = tx.clone();
            thread::spawn(move || {
                let mut m: HashMap<String, Vec<u64>> = HashMap::new();
                for i in 0..20000u64 {
                    m.entry(format!("k{}", i % 300)).or_default().push(i * w);
                }
                tx.send(m.values().map(|v| v.len()).sum::<usize>()).unwrap();
            })
        })
        .collect();
    drop(tx);
    for w in workers {
        w.join().unwrap();
    }
    let total: usize = rx.iter().sum();
    let caught = std::panic::catch_unwind(|| {
        let v: Vec<u32> = Vec::new();
        v[3]
    })
    .is_err();
    println!("total={total} caught_panic={caught}");
}
