//! The expressions of WHERE and WEIGHT clauses: parsed by `sqlparser`, checked once against
//! the file attributes and functions a policy may use, then evaluated per file.
//!
//! Evaluation never fails: as in SQL, an operation on values of the wrong type, a division
//! by zero or an absent attribute gives NULL, and a WHERE clause that is not TRUE does not
//! match. Timestamps are seconds since the Unix epoch; `DAYS(t)` is whole days since then,
//! so `DAYS(CURRENT_TIMESTAMP) - DAYS(ACCESS_TIME) > 30` means what it means in GPFS.

use sqlparser::ast::{
    BinaryOperator, DateTimeField, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Spanned,
    UnaryOperator, Value as SqlValue,
};

use crate::PolicyError;

/// The attributes of one file that rules read (GPFS's names in the rules).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileAttrs {
    /// `NAME`: the last component of the path.
    pub name: String,
    /// `PATH_NAME`: the path from the file system's root (empty at placement).
    pub path_name: String,
    /// `FILESET_NAME`: Tessera has one fileset, `root`.
    pub fileset_name: String,
    /// `POOL_NAME`: the storage pool that holds the file's data.
    pub pool_name: String,
    pub user_id: u32,
    pub group_id: u32,
    /// File type and permission bits (`st_mode`); rules see `MODE` as `-rwxr-xr-x`.
    pub mode: u32,
    pub nlink: u32,
    pub inode: u64,
    pub file_size: u64,
    pub kb_allocated: u64,
    /// Seconds since the Unix epoch.
    pub access_time: i64,
    pub modification_time: i64,
    pub change_time: i64,
    pub creation_time: i64,
}

/// Which attributes a clause may read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// A placement rule runs at create, when only these are known (as in GPFS).
    Placement,
    /// Migration, deletion and list rules see every attribute.
    Management,
}

const PLACEMENT_ATTRS: &[&str] = &["NAME", "USER_ID", "GROUP_ID", "FILESET_NAME"];
const ALL_ATTRS: &[&str] = &[
    "NAME",
    "PATH_NAME",
    "FILESET_NAME",
    "POOL_NAME",
    "USER_ID",
    "GROUP_ID",
    "MODE",
    "NLINK",
    "INODE",
    "FILE_SIZE",
    "KB_ALLOCATED",
    "ACCESS_TIME",
    "MODIFICATION_TIME",
    "CHANGE_TIME",
    "CREATION_TIME",
];
/// Functions and how many arguments each takes (min, max).
const FUNCTIONS: &[(&str, usize, usize)] = &[
    ("DAYS", 1, 1),
    ("LOWER", 1, 1),
    ("UPPER", 1, 1),
    ("LENGTH", 1, 1),
    ("SUBSTR", 2, 3),
    ("INTEGER", 1, 1),
    ("INT", 1, 1),
    ("VARCHAR", 1, 1),
    ("CHAR", 1, 1),
    ("MOD", 2, 2),
    ("TIMESTAMP", 1, 1),
    ("CURRENT_TIMESTAMP", 0, 0),
    ("CURRENT_DATE", 0, 0),
];

const DAY_SECONDS: i64 = 86_400;

/// A value during evaluation.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    Null,
}

impl Value {
    fn num(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// Truth in a WHERE clause: only TRUE matches.
    pub(crate) fn is_true(&self) -> bool {
        matches!(self, Value::Bool(true))
    }

    /// A WEIGHT: numbers as they are, anything else 0.
    pub(crate) fn weight(&self) -> f64 {
        self.num().unwrap_or(0.0)
    }
}

fn at(e: &Expr) -> (u64, u64) {
    let s = e.span().start;
    (s.line, s.column)
}

fn refuse(e: &Expr, message: String) -> PolicyError {
    let (line, column) = at(e);
    PolicyError {
        line,
        column,
        message,
    }
}

fn function_name(f: &sqlparser::ast::Function) -> String {
    f.name.to_string().to_ascii_uppercase()
}

fn function_args(f: &sqlparser::ast::Function) -> Result<Vec<&Expr>, String> {
    match &f.args {
        FunctionArguments::None => Ok(Vec::new()),
        FunctionArguments::Subquery(_) => Err("a subquery is not allowed in a policy rule".into()),
        FunctionArguments::List(list) => {
            if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
                return Err(format!("{}: only plain arguments are allowed", f.name));
            }
            list.args
                .iter()
                .map(|a| match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
                    _ => Err(format!("{}: only plain arguments are allowed", f.name)),
                })
                .collect()
        }
    }
}

/// Checks that `e` uses only what a clause of `scope` may: known attributes (unquoted, or
/// quoted by mistake as identifiers), known functions with the right number of arguments,
/// and the operators evaluation implements.
pub(crate) fn check(e: &Expr, scope: Scope) -> Result<(), PolicyError> {
    let attrs = match scope {
        Scope::Placement => PLACEMENT_ATTRS,
        Scope::Management => ALL_ATTRS,
    };
    match e {
        Expr::Identifier(id) => {
            let name = id.value.to_ascii_uppercase();
            if id.quote_style == Some('"') {
                return Err(refuse(
                    e,
                    format!(
                        "\"{}\" is a quoted name, not a string: write '{}' for a string",
                        id.value, id.value
                    ),
                ));
            }
            if name == "CURRENT_TIMESTAMP" || name == "CURRENT_DATE" {
                return Ok(());
            }
            if attrs.contains(&name.as_str()) {
                return Ok(());
            }
            if ALL_ATTRS.contains(&name.as_str()) {
                return Err(refuse(
                    e,
                    format!(
                        "{name} is not known when a file is created; a placement rule may use \
                         only {}",
                        PLACEMENT_ATTRS.join(", ")
                    ),
                ));
            }
            Err(refuse(
                e,
                format!(
                    "unknown file attribute {}; rules may use {}",
                    id.value,
                    attrs.join(", ")
                ),
            ))
        }
        Expr::Value(v) => match &v.value {
            SqlValue::Number(..)
            | SqlValue::SingleQuotedString(_)
            | SqlValue::Boolean(_)
            | SqlValue::Null => Ok(()),
            other => Err(refuse(e, format!("literal {other} is not allowed in a policy rule"))),
        },
        Expr::Nested(inner) | Expr::IsNull(inner) | Expr::IsNotNull(inner) => check(inner, scope),
        Expr::UnaryOp { op, expr } => match op {
            UnaryOperator::Not | UnaryOperator::Minus | UnaryOperator::Plus => check(expr, scope),
            other => Err(refuse(e, format!("operator {other} is not allowed in a policy rule"))),
        },
        Expr::BinaryOp { left, op, right } => {
            use BinaryOperator as B;
            match op {
                B::Plus
                | B::Minus
                | B::Multiply
                | B::Divide
                | B::Modulo
                | B::StringConcat
                | B::Gt
                | B::Lt
                | B::GtEq
                | B::LtEq
                | B::Eq
                | B::NotEq
                | B::And
                | B::Or => {
                    check(left, scope)?;
                    check(right, scope)
                }
                other => Err(refuse(e, format!("operator {other} is not allowed in a policy rule"))),
            }
        }
        Expr::Like {
            expr,
            pattern,
            any: false,
            escape_char,
            ..
        } => {
            if let Some(c) = escape_char {
                if !matches!(c, SqlValue::SingleQuotedString(s) if s.chars().count() == 1) {
                    return Err(refuse(e, format!("ESCAPE {c}: one character in quotes")));
                }
            }
            check(expr, scope)?;
            check(pattern, scope)
        }
        Expr::InList { expr, list, .. } => {
            check(expr, scope)?;
            list.iter().try_for_each(|x| check(x, scope))
        }
        Expr::Between {
            expr, low, high, ..
        } => {
            check(expr, scope)?;
            check(low, scope)?;
            check(high, scope)
        }
        Expr::Function(f) => {
            let name = function_name(f);
            let Some((_, min, max)) = FUNCTIONS.iter().find(|(n, ..)| *n == name) else {
                return Err(refuse(
                    e,
                    format!(
                        "unknown function {}; rules may use {}",
                        f.name,
                        FUNCTIONS.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
                    ),
                ));
            };
            if f.filter.is_some() || f.over.is_some() || !f.within_group.is_empty() {
                return Err(refuse(e, format!("{name}: only plain calls are allowed")));
            }
            let args = function_args(f).map_err(|m| refuse(e, m))?;
            if args.len() < *min || args.len() > *max {
                let want = if min == max {
                    format!("{min}")
                } else {
                    format!("{min} to {max}")
                };
                return Err(refuse(
                    e,
                    format!("{name} takes {want} argument(s), not {}", args.len()),
                ));
            }
            args.into_iter().try_for_each(|a| check(a, scope))
        }
        Expr::Substring {
            expr,
            substring_from,
            substring_for,
            ..
        } => {
            check(expr, scope)?;
            for x in [substring_from, substring_for].into_iter().flatten() {
                check(x, scope)?;
            }
            Ok(())
        }
        Expr::Interval(i) => {
            if interval_unit(i.leading_field.as_ref()).is_none() || i.last_field.is_some() {
                return Err(refuse(
                    e,
                    "an INTERVAL is 'n' DAYS, HOURS, MINUTES or SECONDS".into(),
                ));
            }
            check(&i.value, scope)
        }
        other => Err(refuse(
            e,
            format!("{other} is not allowed in a policy rule (attributes, literals, arithmetic, comparisons, AND/OR/NOT, LIKE, IN, BETWEEN, IS NULL and functions are)"),
        )),
    }
}

fn interval_unit(f: Option<&DateTimeField>) -> Option<i64> {
    Some(match f? {
        DateTimeField::Day | DateTimeField::Days => DAY_SECONDS,
        DateTimeField::Hour | DateTimeField::Hours => 3_600,
        DateTimeField::Minute | DateTimeField::Minutes => 60,
        DateTimeField::Second | DateTimeField::Seconds => 1,
        _ => return None,
    })
}

/// `st_mode` as `ls -l` shows it, which is how GPFS rules see `MODE`.
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & 0o170000 {
        0o040000 => 'd',
        0o120000 => 'l',
        0o010000 => 'p',
        0o140000 => 's',
        0o020000 => 'c',
        0o060000 => 'b',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    for (shift, special, set, set_lower) in [
        (6, 0o4000, 'S', 's'),
        (3, 0o2000, 'S', 's'),
        (0, 0o1000, 'T', 't'),
    ] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let x = bits & 1 != 0;
        s.push(match (mode & special != 0, x) {
            (true, true) => set_lower,
            (true, false) => set,
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// Evaluates a checked expression for one file at time `now` (seconds since the epoch).
pub(crate) fn eval(e: &Expr, f: &FileAttrs, now: i64) -> Value {
    match e {
        Expr::Identifier(id) => attr(&id.value.to_ascii_uppercase(), f, now),
        Expr::Value(v) => match &v.value {
            SqlValue::Number(n, _) => n
                .parse::<i64>()
                .map(Value::Int)
                .or_else(|_| n.parse::<f64>().map(Value::Float))
                .unwrap_or(Value::Null),
            SqlValue::SingleQuotedString(s) => Value::Str(s.clone()),
            SqlValue::Boolean(b) => Value::Bool(*b),
            _ => Value::Null,
        },
        Expr::Nested(inner) => eval(inner, f, now),
        Expr::IsNull(inner) => Value::Bool(eval(inner, f, now) == Value::Null),
        Expr::IsNotNull(inner) => Value::Bool(eval(inner, f, now) != Value::Null),
        Expr::UnaryOp { op, expr } => {
            let v = eval(expr, f, now);
            match (op, v) {
                (UnaryOperator::Not, Value::Bool(b)) => Value::Bool(!b),
                (UnaryOperator::Minus, Value::Int(i)) => Value::Int(i.wrapping_neg()),
                (UnaryOperator::Minus, Value::Float(x)) => Value::Float(-x),
                (UnaryOperator::Plus, v @ (Value::Int(_) | Value::Float(_))) => v,
                _ => Value::Null,
            }
        }
        Expr::BinaryOp { left, op, right } => binary(op, left, right, f, now),
        Expr::Like {
            negated,
            expr,
            pattern,
            escape_char,
            ..
        } => {
            let escape = match escape_char {
                Some(SqlValue::SingleQuotedString(s)) => s.chars().next(),
                _ => None,
            };
            match (eval(expr, f, now), eval(pattern, f, now)) {
                (Value::Str(s), Value::Str(p)) => Value::Bool(like(&s, &p, escape) != *negated),
                _ => Value::Null,
            }
        }
        Expr::InList {
            expr,
            list,
            negated,
        } => {
            let v = eval(expr, f, now);
            if v == Value::Null {
                return Value::Null;
            }
            let found = list
                .iter()
                .any(|x| compare(&v, &eval(x, f, now)) == Some(std::cmp::Ordering::Equal));
            Value::Bool(found != *negated)
        }
        Expr::Between {
            expr,
            negated,
            low,
            high,
        } => {
            let v = eval(expr, f, now);
            match (
                compare(&v, &eval(low, f, now)),
                compare(&v, &eval(high, f, now)),
            ) {
                (Some(lo), Some(hi)) => Value::Bool(
                    (lo != std::cmp::Ordering::Less && hi != std::cmp::Ordering::Greater)
                        != *negated,
                ),
                _ => Value::Null,
            }
        }
        Expr::Function(func) => {
            let args: Vec<Value> = function_args(func)
                .unwrap_or_default()
                .into_iter()
                .map(|a| eval(a, f, now))
                .collect();
            call(&function_name(func), &args, now)
        }
        Expr::Substring {
            expr,
            substring_from,
            substring_for,
            ..
        } => {
            let mut args = vec![eval(expr, f, now)];
            args.push(
                substring_from
                    .as_ref()
                    .map_or(Value::Int(1), |x| eval(x, f, now)),
            );
            if let Some(x) = substring_for {
                args.push(eval(x, f, now));
            }
            call("SUBSTR", &args, now)
        }
        Expr::Interval(i) => {
            let unit = interval_unit(i.leading_field.as_ref()).unwrap_or(0);
            match eval(&i.value, f, now) {
                Value::Int(n) => Value::Int(n.saturating_mul(unit)),
                Value::Str(s) => s
                    .trim()
                    .parse::<i64>()
                    .map(|n| Value::Int(n.saturating_mul(unit)))
                    .unwrap_or(Value::Null),
                _ => Value::Null,
            }
        }
        _ => Value::Null,
    }
}

fn attr(name: &str, f: &FileAttrs, now: i64) -> Value {
    let u = |x: u64| Value::Int(i64::try_from(x).unwrap_or(i64::MAX));
    match name {
        "NAME" => Value::Str(f.name.clone()),
        "PATH_NAME" => Value::Str(f.path_name.clone()),
        "FILESET_NAME" => Value::Str(f.fileset_name.clone()),
        "POOL_NAME" => Value::Str(f.pool_name.clone()),
        "USER_ID" => Value::Int(i64::from(f.user_id)),
        "GROUP_ID" => Value::Int(i64::from(f.group_id)),
        "MODE" => Value::Str(mode_string(f.mode)),
        "NLINK" => Value::Int(i64::from(f.nlink)),
        "INODE" => u(f.inode),
        "FILE_SIZE" => u(f.file_size),
        "KB_ALLOCATED" => u(f.kb_allocated),
        "ACCESS_TIME" => Value::Int(f.access_time),
        "MODIFICATION_TIME" => Value::Int(f.modification_time),
        "CHANGE_TIME" => Value::Int(f.change_time),
        "CREATION_TIME" => Value::Int(f.creation_time),
        "CURRENT_TIMESTAMP" => Value::Int(now),
        "CURRENT_DATE" => Value::Int(now.div_euclid(DAY_SECONDS) * DAY_SECONDS),
        _ => Value::Null,
    }
}

fn call(name: &str, args: &[Value], now: i64) -> Value {
    match (name, args) {
        ("CURRENT_TIMESTAMP", []) => Value::Int(now),
        ("CURRENT_DATE", []) => Value::Int(now.div_euclid(DAY_SECONDS) * DAY_SECONDS),
        ("DAYS", [Value::Int(t)]) => Value::Int(t.div_euclid(DAY_SECONDS)),
        ("LOWER", [Value::Str(s)]) => Value::Str(s.to_lowercase()),
        ("UPPER", [Value::Str(s)]) => Value::Str(s.to_uppercase()),
        ("LENGTH", [Value::Str(s)]) => Value::Int(s.chars().count() as i64),
        ("SUBSTR", [Value::Str(s), Value::Int(start), rest @ ..]) => {
            // SQL counts from 1.
            let skip = usize::try_from((*start).max(1) - 1).unwrap_or(usize::MAX);
            let take = match rest {
                [] => usize::MAX,
                [Value::Int(n)] => usize::try_from((*n).max(0)).unwrap_or(usize::MAX),
                _ => return Value::Null,
            };
            Value::Str(s.chars().skip(skip).take(take).collect())
        }
        ("INTEGER" | "INT", [Value::Int(i)]) => Value::Int(*i),
        ("INTEGER" | "INT", [Value::Float(x)]) => Value::Int(*x as i64),
        ("INTEGER" | "INT", [Value::Str(s)]) => s
            .trim()
            .parse::<i64>()
            .map(Value::Int)
            .unwrap_or(Value::Null),
        ("VARCHAR" | "CHAR", [Value::Int(i)]) => Value::Str(i.to_string()),
        ("VARCHAR" | "CHAR", [Value::Float(x)]) => Value::Str(x.to_string()),
        ("VARCHAR" | "CHAR", [Value::Str(s)]) => Value::Str(s.clone()),
        ("MOD", [Value::Int(a), Value::Int(b)]) if *b != 0 => Value::Int(a.rem_euclid(*b)),
        ("TIMESTAMP", [Value::Str(s)]) => parse_timestamp(s).map_or(Value::Null, Value::Int),
        ("TIMESTAMP", [Value::Int(t)]) => Value::Int(*t),
        _ => Value::Null,
    }
}

/// `YYYY-MM-DD[ HH:MM[:SS]]` (UTC) as seconds since the epoch.
fn parse_timestamp(s: &str) -> Option<i64> {
    let s = s.trim();
    let (date, time) = if s.len() > 10 {
        (s.get(..10)?, s.get(10..)?.trim_start_matches([' ', 'T']))
    } else {
        (s, "")
    };
    let mut d = date.splitn(3, '-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut secs = 0;
    if !time.is_empty() {
        let mut t = time.splitn(3, ':');
        let h: i64 = t.next()?.parse().ok()?;
        let min: i64 = t.next()?.parse().ok()?;
        let sec: i64 = t.next().map_or(Some(0), |x| x.parse().ok())?;
        if h > 23 || min > 59 || sec > 60 {
            return None;
        }
        secs = h * 3600 + min * 60 + sec;
    }
    Some(days_from_civil(y, m, day) * DAY_SECONDS + secs)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::Str(x), Value::Str(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        _ => a.num()?.partial_cmp(&b.num()?),
    }
}

fn binary(op: &BinaryOperator, l: &Expr, r: &Expr, f: &FileAttrs, now: i64) -> Value {
    use std::cmp::Ordering as O;
    use BinaryOperator as B;
    // AND and OR with SQL's three-valued logic, short-circuited.
    if matches!(op, B::And | B::Or) {
        let a = eval(l, f, now);
        let decided = *op != B::And;
        if a == Value::Bool(decided) {
            return a;
        }
        let b = eval(r, f, now);
        return match (a, b) {
            (_, v @ Value::Bool(x)) if x == decided => v,
            (Value::Bool(_), v @ Value::Bool(_)) => v,
            _ => Value::Null,
        };
    }
    let (a, b) = (eval(l, f, now), eval(r, f, now));
    let cmp =
        |want: &dyn Fn(O) -> bool| compare(&a, &b).map_or(Value::Null, |o| Value::Bool(want(o)));
    match op {
        B::Eq => cmp(&|o| o == O::Equal),
        B::NotEq => cmp(&|o| o != O::Equal),
        B::Lt => cmp(&|o| o == O::Less),
        B::LtEq => cmp(&|o| o != O::Greater),
        B::Gt => cmp(&|o| o == O::Greater),
        B::GtEq => cmp(&|o| o != O::Less),
        B::StringConcat => match (&a, &b) {
            (Value::Null, _) | (_, Value::Null) => Value::Null,
            _ => Value::Str(format!("{}{}", text(&a), text(&b))),
        },
        _ => arithmetic(op, &a, &b),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::Float(x) => x.to_string(),
        Value::Str(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Null => String::new(),
    }
}

fn arithmetic(op: &BinaryOperator, a: &Value, b: &Value) -> Value {
    use BinaryOperator as B;
    if let (Value::Int(x), Value::Int(y)) = (a, b) {
        return match op {
            B::Plus => x.checked_add(*y).map_or(Value::Null, Value::Int),
            B::Minus => x.checked_sub(*y).map_or(Value::Null, Value::Int),
            B::Multiply => x.checked_mul(*y).map_or(Value::Null, Value::Int),
            B::Divide if *y != 0 => Value::Int(x / y),
            B::Modulo if *y != 0 => Value::Int(x % y),
            _ => Value::Null,
        };
    }
    let (Some(x), Some(y)) = (a.num(), b.num()) else {
        return Value::Null;
    };
    let v = match op {
        B::Plus => x + y,
        B::Minus => x - y,
        B::Multiply => x * y,
        B::Divide if y != 0.0 => x / y,
        B::Modulo if y != 0.0 => x % y,
        _ => return Value::Null,
    };
    Value::Float(v)
}

/// SQL LIKE: `%` any run of characters, `_` one character, `escape` makes the next one
/// literal. Linear in the text per pattern position (no backtracking blow-up).
pub(crate) fn like(text: &str, pattern: &str, escape: Option<char>) -> bool {
    enum P {
        Any,
        One,
        Lit(char),
    }
    let mut pat = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        pat.push(match c {
            c if Some(c) == escape => match chars.next() {
                Some(n) => P::Lit(n),
                None => P::Lit(c),
            },
            '%' => P::Any,
            '_' => P::One,
            c => P::Lit(c),
        });
    }
    let text: Vec<char> = text.chars().collect();
    // reach[i]: the pattern so far can end just before text[i].
    let mut reach = vec![false; text.len() + 1];
    reach[0] = true;
    for p in &pat {
        let mut next = vec![false; text.len() + 1];
        match p {
            P::Any => {
                let mut on = false;
                for i in 0..=text.len() {
                    on |= reach[i];
                    next[i] = on;
                }
            }
            P::One => {
                next[1..].copy_from_slice(&reach[..text.len()]);
            }
            P::Lit(c) => {
                for i in 0..text.len() {
                    next[i + 1] = reach[i] && text[i] == *c;
                }
            }
        }
        reach = next;
    }
    reach[text.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_matches_as_sql_does() {
        assert!(like("a.tmp", "%.tmp", None));
        assert!(!like("a.tmpx", "%.tmp", None));
        assert!(like("abc", "a_c", None));
        assert!(!like("ac", "a_c", None));
        assert!(like("", "%", None));
        assert!(like("100%", "100!%", Some('!')));
        assert!(!like("1000", "100!%", Some('!')));
        assert!(like("ä.dat", "_.dat", None));
        assert!(like(&"a".repeat(200), &"%a".repeat(50), None));
    }

    #[test]
    fn modes_read_as_ls_shows_them() {
        assert_eq!(mode_string(0o100644), "-rw-r--r--");
        assert_eq!(mode_string(0o040755), "drwxr-xr-x");
        assert_eq!(mode_string(0o104755), "-rwsr-xr-x");
        assert_eq!(mode_string(0o041777), "drwxrwxrwt");
        assert_eq!(mode_string(0o120777), "lrwxrwxrwx");
    }

    #[test]
    fn timestamps_are_utc_seconds() {
        assert_eq!(parse_timestamp("1970-01-01"), Some(0));
        assert_eq!(parse_timestamp("2000-03-01 00:00:01"), Some(951_868_801));
        assert_eq!(parse_timestamp("2026-11-27 12:30"), Some(1_795_782_600));
        assert_eq!(parse_timestamp("2026-13-01"), None);
        assert_eq!(parse_timestamp("yesterday"), None);
    }
}
