//! Inequalities in one variable read as the intervals they describe, so that an inequality gold can be
//! met by an interval prediction (grading spec §4.4: "the reverse may be accepted", as in Math-Verify).

use super::expr::Expr;
use super::value::{self, split_top, Interval, Rel, Value};

/// The intervals an inequality in one variable describes: `x > 2` is `(2, ∞)`, `-1 \le x < 3` is
/// `[-1, 3)`, `x \ne 0` is `(-∞, 0) ∪ (0, ∞)`, and a list of them in the same variable (`x < 2, x > 3`,
/// as `or` becomes) is their union. `None` for anything else: two variables, a bound with a variable
/// in it, mixed directions.
pub fn intervals(s: &str) -> Option<Vec<Interval>> {
    let mut variable: Option<String> = None;
    let mut out = Vec::new();
    for piece in split_top(s, ",") {
        let (operands, ops) = relation_chain(&piece)?;
        let var_of = |t: &str| match Value::parse(t) {
            Value::Expr(Expr::Var(v)) => Some(v),
            _ => None,
        };
        let bound = |t: &str| {
            let v = Value::parse(t);
            let constant = match &v {
                Value::Num { .. } => true,
                Value::Expr(e) => e.vars().is_empty(),
                _ => false,
            };
            constant.then(|| Box::new(v))
        };
        let infinite =
            |negative: bool| Box::new(Value::parse(if negative { "-\\infty" } else { "\\infty" }));
        let (name, pieces) = match (operands.as_slice(), ops.as_slice()) {
            ([a, b], [op]) => {
                let (name, op, c) = match (var_of(a), var_of(b)) {
                    (Some(v), None) => (v, *op, bound(b)?),
                    (None, Some(v)) => (v, op.flipped(), bound(a)?),
                    _ => return None,
                };
                let below = |closed| Interval {
                    lo: infinite(true),
                    hi: c.clone(),
                    lo_closed: false,
                    hi_closed: closed,
                };
                let above = |closed| Interval {
                    lo: c.clone(),
                    hi: infinite(false),
                    lo_closed: closed,
                    hi_closed: false,
                };
                let pieces = match op {
                    Rel::Lt | Rel::Le => vec![below(op == Rel::Le)],
                    Rel::Gt | Rel::Ge => vec![above(op == Rel::Ge)],
                    Rel::Ne => vec![below(false), above(false)],
                    Rel::Eq => return None,
                };
                (name, pieces)
            }
            ([a, x, b], [o1, o2]) => {
                let name = var_of(x)?;
                let (a, b) = (bound(a)?, bound(b)?);
                let less = |o: &Rel| matches!(o, Rel::Lt | Rel::Le);
                let greater = |o: &Rel| matches!(o, Rel::Gt | Rel::Ge);
                let iv = if less(o1) && less(o2) {
                    Interval {
                        lo: a,
                        hi: b,
                        lo_closed: *o1 == Rel::Le,
                        hi_closed: *o2 == Rel::Le,
                    }
                } else if greater(o1) && greater(o2) {
                    Interval {
                        lo: b,
                        hi: a,
                        lo_closed: *o2 == Rel::Ge,
                        hi_closed: *o1 == Rel::Ge,
                    }
                } else {
                    return None;
                };
                (name, vec![iv])
            }
            _ => return None,
        };
        if variable.get_or_insert_with(|| name.clone()) != &name {
            return None;
        }
        out.extend(pieces);
    }
    Some(out)
}

/// A chain of one or two relations at the top level, `a < x \le b`: its operands and relations.
fn relation_chain(s: &str) -> Option<(Vec<String>, Vec<Rel>)> {
    let (operands, ops) = value::relation_chain(s);
    let empty = operands.iter().any(|o| o.is_empty());
    let ops: Vec<Rel> = ops.into_iter().map(|(_, rel)| rel).collect();
    (!ops.is_empty() && ops.len() <= 2 && !empty).then_some((operands, ops))
}
