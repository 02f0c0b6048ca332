//! Prints `oxgrind_symbols::demangle` of each line of stdin (to compare with `c++filt`).
use std::io::BufRead;

fn main() {
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        println!("{}", oxgrind_symbols::demangle(&line));
    }
}
