//! A small LaTeX expression parser and evaluator (grading spec §3–§4): + − · / ^, `\frac`,
//! `\sqrt[n]`, π, e, i, trigonometric and logarithmic functions, absolute values, floors and
//! ceilings, factorials, binomial coefficients and single-letter variables, with implicit
//! multiplication. Values are complex numbers, so that `a+bi` answers and identity tests at complex
//! points both work.

use num_complex::Complex64;
use std::collections::BTreeSet;

/// An expression tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Num(f64),
    Var(String),
    Pi,
    E,
    I,
    Neg(Box<Expr>),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    Div(Box<Expr>, Box<Expr>),
    Pow(Box<Expr>, Box<Expr>),
    Root(Box<Expr>, Box<Expr>),
    Fact(Box<Expr>),
    /// `\binom{n}{k}`.
    Binom(Box<Expr>, Box<Expr>),
    Func(&'static str, Box<Expr>),
}

/// Largest exponent magnitude and factorial argument evaluated (spec §4.5: give up beyond).
const MAX_EXPONENT: f64 = 1000.0;
const MAX_FACTORIAL: f64 = 170.0;
/// Largest `n` of a binomial coefficient evaluated (its smaller side, `min(k, n − k)`, is at most
/// that too, so the product stays bounded; `\binom{10^6}{5}` evaluates, `\binom{10^9}{k}` does not).
const MAX_BINOMIAL: f64 = 1e6;

const FUNCS: &[&str] = &[
    "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "sin", "cos", "tan", "cot", "sec", "csc",
    "log", "ln", "exp",
];

/// Greek letters read as variables (`\theta`), longest first for prefix matching.
pub(crate) const GREEK: &[&str] = &[
    "epsilon", "lambda", "alpha", "gamma", "delta", "theta", "kappa", "omega", "sigma", "beta",
    "zeta", "iota", "phi", "psi", "chi", "rho", "tau", "eta", "mu", "nu", "xi",
];

/// Every macro the parser knows, longest first: normalisation removes spaces, so `\cos x` arrives
/// as `\cosx` and is read as the longest known macro (`\cos`) followed by the rest (`x`).
const KNOWN: &[&str] = &[
    "arcsin", "arccos", "arctan", "epsilon", "lambda", "alpha", "gamma", "delta", "theta", "kappa",
    "lfloor", "rfloor", "omega", "sigma", "binom", "lceil", "rceil", "cdot", "times", "sinh",
    "cosh", "tanh", "frac", "sqrt", "beta", "zeta", "iota", "sin", "cos", "tan", "cot", "sec",
    "csc", "log", "exp", "div", "phi", "psi", "chi", "rho", "tau", "eta", "ln", "pi", "mu", "nu",
    "xi",
];

impl Expr {
    /// Parses a normalised LaTeX string; `None` when it is not an expression.
    pub fn parse(s: &str) -> Option<Expr> {
        let mut p = Parser {
            s: s.as_bytes(),
            pos: 0,
            depth: 0,
        };
        let e = p.expr()?;
        (p.pos == p.s.len()).then_some(e)
    }

    /// Free variables.
    pub fn vars(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        self.visit(&mut |e| {
            if let Expr::Var(v) = e {
                out.insert(v.clone());
            }
        });
        out
    }

    /// Whether a number is written anywhere in it (`2x`, `x^2`, `\sqrt{x}`'s implied index).
    pub fn has_number(&self) -> bool {
        let mut found = false;
        self.visit(&mut |e| found |= matches!(e, Expr::Num(_)));
        found
    }

    /// Calls `f` on this node and every node below it.
    fn visit(&self, f: &mut dyn FnMut(&Expr)) {
        use Expr::*;
        f(self);
        match self {
            Neg(a) | Fact(a) | Func(_, a) => a.visit(f),
            Add(a, b)
            | Sub(a, b)
            | Mul(a, b)
            | Div(a, b)
            | Pow(a, b)
            | Root(a, b)
            | Binom(a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Var(_) | Num(_) | Pi | E | I => {}
        }
    }

    /// The value with variables bound by `env` (`None`: undefined, or beyond the safety caps).
    pub fn eval(&self, env: &dyn Fn(&str) -> Option<Complex64>) -> Option<Complex64> {
        use Expr::*;
        let c = |x: f64| Complex64::new(x, 0.0);
        let v = match self {
            Num(x) => c(*x),
            Var(name) => env(name)?,
            Pi => c(std::f64::consts::PI),
            E => c(std::f64::consts::E),
            I => Complex64::i(),
            Neg(a) => -a.eval(env)?,
            Add(a, b) => a.eval(env)? + b.eval(env)?,
            Sub(a, b) => a.eval(env)? - b.eval(env)?,
            Mul(a, b) => a.eval(env)? * b.eval(env)?,
            Div(a, b) => {
                let d = b.eval(env)?;
                if d.norm() == 0.0 {
                    return None;
                }
                a.eval(env)? / d
            }
            Pow(a, b) => {
                let (base, exp) = (a.eval(env)?, b.eval(env)?);
                if exp.norm() > MAX_EXPONENT {
                    return None;
                }
                if exp.im == 0.0 && exp.re.fract() == 0.0 {
                    base.powi(exp.re as i32)
                } else if base.im == 0.0 && base.re >= 0.0 && exp.im == 0.0 {
                    c(base.re.powf(exp.re))
                } else {
                    base.powc(exp)
                }
            }
            Root(n, x) => {
                let (n, x) = (n.eval(env)?, x.eval(env)?);
                // Real odd roots of negative numbers stay real.
                if n.im == 0.0 && x.im == 0.0 && x.re < 0.0 && (n.re as i64) % 2 == 1 {
                    c(-(-x.re).powf(1.0 / n.re))
                } else if n == c(2.0) {
                    x.sqrt()
                } else {
                    x.powc(n.inv())
                }
            }
            Fact(a) => {
                let x = a.eval(env)?;
                if x.im != 0.0 || x.re < 0.0 || x.re.fract() != 0.0 || x.re > MAX_FACTORIAL {
                    return None;
                }
                c((1..=x.re as u64).map(|k| k as f64).product())
            }
            Binom(n, k) => {
                let (n, k) = (n.eval(env)?, k.eval(env)?);
                let whole = |x: Complex64| x.im == 0.0 && x.re.fract() == 0.0 && x.re >= 0.0;
                if !whole(n) || !whole(k) || n.re > MAX_BINOMIAL {
                    return None;
                }
                if k.re > n.re {
                    return Some(c(0.0));
                }
                // The product over the smaller side, each step exact while the value fits f64's
                // integers: C(n, i) = C(n, i − 1) · (n − i + 1) / i.
                let k = k.re.min(n.re - k.re) as u64;
                c((1..=k).fold(1.0, |acc, i| acc * (n.re - i as f64 + 1.0) / i as f64))
            }
            Func(f, a) => {
                let x = a.eval(env)?;
                match *f {
                    "sin" => x.sin(),
                    "cos" => x.cos(),
                    "tan" => x.tan(),
                    "cot" => x.tan().inv(),
                    "sec" => x.cos().inv(),
                    "csc" => x.sin().inv(),
                    "arcsin" => x.asin(),
                    "arccos" => x.acos(),
                    "arctan" => x.atan(),
                    "sinh" => x.sinh(),
                    "cosh" => x.cosh(),
                    "tanh" => x.tanh(),
                    "ln" => x.ln(),
                    "log" => x.ln() / 10f64.ln(),
                    "exp" => x.exp(),
                    "abs" => c(x.norm()),
                    // Defined on the reals only: at a complex test point, no value (try another).
                    "floor" | "ceil" if x.im.abs() > 1e-12 => return None,
                    "floor" => c(snapped(x.re).floor()),
                    "ceil" => c(snapped(x.re).ceil()),
                    _ => return None,
                }
            }
        };
        (v.re.is_finite() && v.im.is_finite()).then_some(v)
    }
}

/// `x`, or the integer it is within rounding error of (relative 1e-9), so that a floor or ceiling of
/// an integer computed in floating point (`\lfloor 0.1 \cdot 30 \rfloor`) is that integer.
fn snapped(x: f64) -> f64 {
    let r = x.round();
    if (x - r).abs() <= 1e-9 * r.abs().max(1.0) {
        r
    } else {
        x
    }
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    /// Nesting depth, capped so that adversarial input cannot exhaust the stack.
    depth: usize,
}

/// Deepest nesting of groups the parser follows.
const MAX_DEPTH: usize = 64;

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn rest(&self) -> &str {
        std::str::from_utf8(&self.s[self.pos..]).unwrap_or("")
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.rest().starts_with(lit) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    /// A macro name at the cursor (`\name`), without consuming it: the whole run of letters, or
    /// when that is no macro the parser knows, the longest known macro it starts with.
    fn macro_name(&self) -> Option<&str> {
        let r = self.rest().strip_prefix('\\')?;
        let n = r.chars().take_while(|c| c.is_ascii_alphabetic()).count();
        if n == 0 {
            return None;
        }
        let word = &r[..n];
        if KNOWN.contains(&word) {
            return Some(word);
        }
        Some(
            KNOWN
                .iter()
                .find(|k| word.starts_with(**k))
                .map_or(word, |k| &word[..k.len()]),
        )
    }

    fn expr(&mut self) -> Option<Expr> {
        self.nested(Self::expr_inner)
    }

    fn expr_inner(&mut self) -> Option<Expr> {
        let mut lhs = self.term()?;
        loop {
            if self.eat("+") {
                lhs = Expr::Add(Box::new(lhs), Box::new(self.term()?));
            } else if self.eat("-") {
                lhs = Expr::Sub(Box::new(lhs), Box::new(self.term()?));
            } else {
                return Some(lhs);
            }
        }
    }

    fn term(&mut self) -> Option<Expr> {
        let mut lhs = self.unary()?;
        loop {
            if self.eat("*") || self.eat("\\cdot") || self.eat("\\times") {
                lhs = Expr::Mul(Box::new(lhs), Box::new(self.unary()?));
            } else if self.eat("/") || self.eat("\\div") {
                lhs = Expr::Div(Box::new(lhs), Box::new(self.unary()?));
            } else if self.starts_primary() {
                lhs = Expr::Mul(Box::new(lhs), Box::new(self.power()?));
            } else {
                return Some(lhs);
            }
        }
    }

    /// Runs `f` one level deeper, or fails beyond [`MAX_DEPTH`].
    fn nested(&mut self, f: impl FnOnce(&mut Self) -> Option<Expr>) -> Option<Expr> {
        self.depth += 1;
        let e = if self.depth > MAX_DEPTH {
            None
        } else {
            f(self)
        };
        self.depth -= 1;
        e
    }

    fn unary(&mut self) -> Option<Expr> {
        // Runs of signs and of function names recurse too, so they count as nesting.
        if self.eat("-") {
            return Some(Expr::Neg(Box::new(self.nested(Self::unary)?)));
        }
        if self.eat("+") {
            return self.nested(Self::unary);
        }
        self.power()
    }

    fn power(&mut self) -> Option<Expr> {
        let base = self.postfix()?;
        if self.eat("^") {
            let exp = if self.peek() == Some(b'{') {
                self.group(b'{', b'}')?
            } else if self.peek() == Some(b'-') {
                self.pos += 1;
                Expr::Neg(Box::new(self.atom_token()?))
            } else {
                self.atom_token()?
            };
            return Some(Expr::Pow(Box::new(base), Box::new(exp)));
        }
        Some(base)
    }

    fn postfix(&mut self) -> Option<Expr> {
        let mut e = self.primary()?;
        while self.eat("!") {
            e = Expr::Fact(Box::new(e));
        }
        Some(e)
    }

    /// Whether a primary (an implicit multiplication's right factor) starts here.
    fn starts_primary(&self) -> bool {
        match self.peek() {
            Some(c) if c.is_ascii_alphanumeric() || c == b'(' || c == b'{' => true,
            Some(b'\\') => self
                .macro_name()
                .is_some_and(|m| !matches!(m, "cdot" | "times" | "div" | "rfloor" | "rceil")),
            _ => false,
        }
    }

    /// One token used as an exponent or a braceless argument: a digit, a letter or a macro.
    fn atom_token(&mut self) -> Option<Expr> {
        match self.peek()? {
            c if c.is_ascii_digit() => {
                self.pos += 1;
                Some(Expr::Num((c - b'0') as f64))
            }
            _ => self.primary(),
        }
    }

    fn group(&mut self, open: u8, close: u8) -> Option<Expr> {
        if self.peek() != Some(open) {
            return None;
        }
        self.pos += 1;
        let e = self.expr()?;
        (self.peek() == Some(close)).then(|| self.pos += 1)?;
        Some(e)
    }

    fn number(&mut self) -> Option<Expr> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.peek() == Some(b'.') && self.s.get(self.pos + 1).is_some_and(|c| c.is_ascii_digit())
        {
            self.pos += 1;
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
        }
        std::str::from_utf8(&self.s[start..self.pos])
            .ok()?
            .parse::<f64>()
            .ok()
            .map(Expr::Num)
    }

    fn primary(&mut self) -> Option<Expr> {
        match self.peek()? {
            c if c.is_ascii_digit() => self.number(),
            b'(' => self.group(b'(', b')'),
            b'{' => self.group(b'{', b'}'),
            b'|' => {
                self.pos += 1;
                let e = self.expr()?;
                self.eat("|").then_some(())?;
                Some(Expr::Func("abs", Box::new(e)))
            }
            c if c.is_ascii_alphabetic() => {
                self.pos += 1;
                let name = (c as char).to_string();
                let e = match name.as_str() {
                    "e" => Expr::E,
                    "i" => Expr::I,
                    _ => {
                        // A subscripted variable: x_1, x_{12}.
                        if self.eat("_") {
                            let sub = if self.peek() == Some(b'{') {
                                let end = self.rest().find('}')?;
                                let s = self.rest()[1..end].to_string();
                                self.pos += end + 1;
                                s
                            } else {
                                let c = self.peek()? as char;
                                self.pos += 1;
                                c.to_string()
                            };
                            return Some(Expr::Var(format!("{name}_{sub}")));
                        }
                        Expr::Var(name)
                    }
                };
                Some(e)
            }
            b'\\' => self.nested(Self::command),
            _ => None,
        }
    }

    fn command(&mut self) -> Option<Expr> {
        let name = self.macro_name()?.to_string();
        self.pos += 1 + name.len();
        match name.as_str() {
            "frac" => {
                let num = self.group(b'{', b'}')?;
                let den = self.group(b'{', b'}')?;
                Some(Expr::Div(Box::new(num), Box::new(den)))
            }
            "sqrt" => {
                let n = if self.peek() == Some(b'[') {
                    self.group(b'[', b']')?
                } else {
                    Expr::Num(2.0)
                };
                let x = self.group(b'{', b'}')?;
                Some(Expr::Root(Box::new(n), Box::new(x)))
            }
            "binom" => {
                let n = self.group(b'{', b'}')?;
                let k = self.group(b'{', b'}')?;
                Some(Expr::Binom(Box::new(n), Box::new(k)))
            }
            "pi" => Some(Expr::Pi),
            // `\lfloor x \rfloor` and `\lceil x \rceil`, read as brackets around their argument.
            "lfloor" | "lceil" => {
                let x = self.expr()?;
                let (close, f) = if name == "lfloor" {
                    ("\\rfloor", "floor")
                } else {
                    ("\\rceil", "ceil")
                };
                self.eat(close).then_some(Expr::Func(f, Box::new(x)))
            }
            g if GREEK.contains(&g) => Some(Expr::Var(g.to_string())),
            "exp" => {
                let arg = self.func_arg()?;
                Some(Expr::Func("exp", Box::new(arg)))
            }
            f => {
                let f = FUNCS.iter().find(|&&g| g == f)?;
                // \log_b x
                if *f == "log" && self.eat("_") {
                    let base = if self.peek() == Some(b'{') {
                        self.group(b'{', b'}')?
                    } else {
                        self.atom_token()?
                    };
                    let arg = self.func_arg()?;
                    let ln = |e| Expr::Func("ln", Box::new(e));
                    return Some(Expr::Div(Box::new(ln(arg)), Box::new(ln(base))));
                }
                // \sin^2 x = (\sin x)^2
                let power = if self.eat("^") {
                    Some(if self.peek() == Some(b'{') {
                        self.group(b'{', b'}')?
                    } else {
                        self.atom_token()?
                    })
                } else {
                    None
                };
                let arg = self.func_arg()?;
                let call = Expr::Func(f, Box::new(arg));
                Some(match power {
                    Some(p) => Expr::Pow(Box::new(call), Box::new(p)),
                    None => call,
                })
            }
        }
    }

    /// A function's argument: a parenthesised or braced group, or without brackets the product of
    /// factors up to the next operator, function, root, fraction or bracket, as every reader of LaTeX
    /// takes it: `\sin 2x` is sin(2x), `\sin x \cos x` is sin(x)·cos(x).
    fn func_arg(&mut self) -> Option<Expr> {
        match self.peek()? {
            b'(' => self.group(b'(', b')'),
            b'{' => self.group(b'{', b'}'),
            _ => {
                let mut arg = self.power()?;
                while self.starts_bare_factor() {
                    arg = Expr::Mul(Box::new(arg), Box::new(self.power()?));
                }
                Some(arg)
            }
        }
    }

    /// Whether a factor that continues a bracketless function argument starts here: a digit, a
    /// letter, a Greek letter or π (not a function, root, fraction or bracket).
    fn starts_bare_factor(&self) -> bool {
        match self.peek() {
            Some(c) if c.is_ascii_alphanumeric() => true,
            Some(b'\\') => self
                .macro_name()
                .is_some_and(|m| m == "pi" || GREEK.contains(&m)),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(s: &str) -> Complex64 {
        Expr::parse(s).unwrap().eval(&|_| None).unwrap()
    }

    #[test]
    fn parses_and_evaluates() {
        assert!((val("3\\sqrt{13}").re - 10.816653826391969).abs() < 1e-12);
        assert!((val("2\\frac{\\pi}{3}") - val("\\frac{2\\pi}{3}")).norm() < 1e-12);
        assert_eq!(val("6-5i"), Complex64::new(6.0, -5.0));
        assert_eq!(val("-5i+6"), Complex64::new(6.0, -5.0));
        assert_eq!(val("2^{10}"), Complex64::new(1024.0, 0.0));
        assert_eq!(val("5!"), Complex64::new(120.0, 0.0));
        assert!((val("\\sqrt[3]{-8}").re + 2.0).abs() < 1e-12);
        assert!(
            (val("\\log_28").re - 3.0).abs() < 1e-12,
            "normalised: no spaces"
        );
        assert!((val("\\sin^2(1)+\\cos^2(1)").re - 1.0).abs() < 1e-12);
        assert_eq!(
            Expr::parse("(a+5)(b+2)")
                .unwrap()
                .vars()
                .into_iter()
                .collect::<Vec<_>>(),
            vec!["a", "b"]
        );
        assert!(Expr::parse("2^{100000}").unwrap().eval(&|_| None).is_none());
        assert!(
            Expr::parse("Evelyn").is_some(),
            "a product of letters parses"
        );
        assert!(Expr::parse("(1,2)").is_none());
    }
}
