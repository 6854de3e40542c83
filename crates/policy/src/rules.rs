//! The RULE statements of a policy file [mmchpolicy], parsed over `sqlparser`'s tokens: the
//! statement structure here, every WHERE and WEIGHT expression by `sqlparser` itself.
//!
//! ```text
//! RULE ['name'] SET POOL 'pool' [LIMIT(pct)] [REPLICATE(1)] [FOR FILESET('f',...)] [WHERE expr]
//! RULE ['name'] MIGRATE [FROM POOL 'pool' [THRESHOLD(high,low)]] [WEIGHT(expr)]
//!               TO POOL 'pool' [LIMIT(pct)] [REPLICATE(1)] [FOR FILESET(...)] [WHERE expr]
//! RULE ['name'] DELETE [FROM POOL 'pool' [THRESHOLD(high,low)]] [WEIGHT(expr)]
//!               [FOR FILESET(...)] [WHERE expr]
//! RULE ['name'] LIST 'list' [FROM POOL 'pool'] [WEIGHT(expr)] [FOR FILESET(...)] [WHERE expr]
//! RULE EXTERNAL LIST 'list' EXEC ''
//! ```
//! Rules may end with `;`; `/* */` and `--` comments are allowed. The optional clauses come
//! in any order, each once. Keywords are case-insensitive, pool and list names are not.

use std::fmt;

use sqlparser::ast::Expr;
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::Token;

use crate::expr::{self, FileAttrs, Scope};
use crate::PolicyError;

/// The longest policy a file system keeps (it is stored in the file-system descriptor).
pub const POLICY_BYTES_MAX: usize = 64 * 1024;

/// A pool named as a source, with the occupancy that starts and stops a migration.
#[derive(Clone, Debug, PartialEq)]
pub struct FromPool {
    pub pool: String,
    pub threshold: Option<Threshold>,
}

/// `THRESHOLD(high, low)`: the rule applies when the pool is at least `high` percent full,
/// and moves or deletes files until it is at most `low` percent full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threshold {
    pub high: u8,
    pub low: u8,
}

/// What a rule does.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Placement at create: new files that match get their data in `pool`, unless the
    /// pool is fuller than `limit` percent.
    SetPool { pool: String, limit: Option<u8> },
    Migrate {
        from: Option<FromPool>,
        weight: Option<Expr>,
        to: String,
        limit: Option<u8>,
    },
    Delete {
        from: Option<FromPool>,
        weight: Option<Expr>,
    },
    List {
        list: String,
        from: Option<FromPool>,
        weight: Option<Expr>,
    },
    /// `EXTERNAL LIST 'name' EXEC ''`: declares a list that `LIST` rules fill and
    /// `policy apply` prints.
    ExternalList { list: String },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub name: Option<String>,
    /// Where the rule starts in the policy text.
    pub line: u64,
    pub action: Action,
    /// `FOR FILESET(...)`: the rule applies only to files of these filesets.
    pub filesets: Option<Vec<String>>,
    pub condition: Option<Expr>,
}

impl Rule {
    /// Whether the rule applies to `f` at time `now` (its filesets and its WHERE clause).
    pub fn matches(&self, f: &FileAttrs, now: i64) -> bool {
        if let Some(sets) = &self.filesets {
            if !sets.contains(&f.fileset_name) {
                return false;
            }
        }
        self.condition
            .as_ref()
            .is_none_or(|c| expr::eval(c, f, now).is_true())
    }

    /// The rule's WEIGHT for `f` (0 without one): candidates go in decreasing weight.
    pub fn weight(&self, f: &FileAttrs, now: i64) -> f64 {
        let w = match &self.action {
            Action::Migrate { weight, .. }
            | Action::Delete { weight, .. }
            | Action::List { weight, .. } => weight.as_ref(),
            _ => None,
        };
        w.map_or(0.0, |w| expr::eval(w, f, now).weight())
    }

    /// The pool the rule takes files from, if it names one.
    pub fn from_pool(&self) -> Option<&FromPool> {
        match &self.action {
            Action::Migrate { from, .. }
            | Action::Delete { from, .. }
            | Action::List { from, .. } => from.as_ref(),
            _ => None,
        }
    }

    /// A label for messages: the rule's name, or where it starts.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("rule '{n}'"),
            None => format!("the rule at line {}", self.line),
        }
    }
}

fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl fmt::Display for FromPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FROM POOL {}", quoted(&self.pool))?;
        if let Some(t) = self.threshold {
            write!(f, " THRESHOLD({},{})", t.high, t.low)?;
        }
        Ok(())
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RULE")?;
        if let Some(n) = &self.name {
            write!(f, " {}", quoted(n))?;
        }
        let from_weight =
            |f: &mut fmt::Formatter<'_>, from: &Option<FromPool>, weight: &Option<Expr>| {
                if let Some(from) = from {
                    write!(f, " {from}")?;
                }
                if let Some(w) = weight {
                    write!(f, " WEIGHT({w})")?;
                }
                Ok(())
            };
        match &self.action {
            Action::SetPool { pool, limit } => {
                write!(f, " SET POOL {}", quoted(pool))?;
                if let Some(l) = limit {
                    write!(f, " LIMIT({l})")?;
                }
            }
            Action::Migrate {
                from,
                weight,
                to,
                limit,
            } => {
                f.write_str(" MIGRATE")?;
                from_weight(f, from, weight)?;
                write!(f, " TO POOL {}", quoted(to))?;
                if let Some(l) = limit {
                    write!(f, " LIMIT({l})")?;
                }
            }
            Action::Delete { from, weight } => {
                f.write_str(" DELETE")?;
                from_weight(f, from, weight)?;
            }
            Action::List { list, from, weight } => {
                write!(f, " LIST {}", quoted(list))?;
                from_weight(f, from, weight)?;
            }
            Action::ExternalList { list } => {
                return write!(f, " EXTERNAL LIST {} EXEC ''", quoted(list));
            }
        }
        if let Some(sets) = &self.filesets {
            let sets: Vec<String> = sets.iter().map(|s| quoted(s)).collect();
            write!(f, " FOR FILESET({})", sets.join(","))?;
        }
        if let Some(c) = &self.condition {
            write!(f, " WHERE {c}")?;
        }
        Ok(())
    }
}

/// A parsed policy: its rules in order, and the text they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    text: String,
    rules: Vec<Rule>,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.rules {
            writeln!(f, "{r};")?;
        }
        Ok(())
    }
}

impl Policy {
    /// Parses `text` for a file system whose storage pools are `pools`. A rule that cannot
    /// be parsed, names a pool not in `pools`, or uses an attribute or function rules do not
    /// have is refused with its line and column.
    pub fn parse(text: &str, pools: &[String]) -> Result<Policy, PolicyError> {
        if text.len() > POLICY_BYTES_MAX {
            return Err(PolicyError {
                line: 0,
                column: 0,
                message: format!(
                    "the policy is {} bytes; a file system keeps at most {POLICY_BYTES_MAX}",
                    text.len()
                ),
            });
        }
        let dialect = GenericDialect {};
        let parser = Parser::new(&dialect)
            .try_with_sql(text)
            .map_err(|e| from_parser(e, (1, 1)))?;
        let end = (
            text.lines().count().max(1) as u64,
            text.lines().last().map_or(0, |l| l.chars().count()) as u64 + 1,
        );
        let mut c = Cursor {
            p: parser,
            pools,
            end,
        };
        let mut rules = Vec::new();
        loop {
            while c.eat_token(&Token::SemiColon) {}
            if c.peek() == Token::EOF {
                break;
            }
            rules.push(c.rule()?);
        }
        let lists: Vec<&str> = rules
            .iter()
            .filter_map(|r| match &r.action {
                Action::ExternalList { list } => Some(list.as_str()),
                _ => None,
            })
            .collect();
        for r in &rules {
            if let Action::List { list, .. } = &r.action {
                if !lists.contains(&list.as_str()) {
                    return Err(PolicyError {
                        line: r.line,
                        column: 1,
                        message: format!(
                            "{} fills list '{list}', which no rule declares; add \
                             RULE EXTERNAL LIST '{list}' EXEC ''",
                            r.label()
                        ),
                    });
                }
            }
        }
        Ok(Policy {
            text: text.to_string(),
            rules,
        })
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether any rule decides where new files go.
    pub fn has_placement_rules(&self) -> bool {
        self.rules
            .iter()
            .any(|r| matches!(r.action, Action::SetPool { .. }))
    }

    /// The first placement rule that matches a file being created, skipping rules whose
    /// pool is fuller than their LIMIT (`full_percent` gives a pool's occupancy). `None`
    /// when no rule matches: the file goes to the file system's default data pool.
    pub fn place(
        &self,
        f: &FileAttrs,
        now: i64,
        full_percent: &dyn Fn(&str) -> u8,
    ) -> Option<(&Rule, &str)> {
        self.rules.iter().find_map(|r| match &r.action {
            Action::SetPool { pool, limit } => {
                if limit.is_some_and(|l| full_percent(pool) >= l) || !r.matches(f, now) {
                    return None;
                }
                Some((r, pool.as_str()))
            }
            _ => None,
        })
    }
}

fn from_parser(e: ParserError, fallback: (u64, u64)) -> PolicyError {
    let text = match e {
        ParserError::TokenizerError(s) | ParserError::ParserError(s) => s,
        ParserError::RecursionLimitExceeded => "the expression nests too deeply".to_string(),
    };
    // sqlparser ends its messages with " at Line: L, Column: C".
    let (message, line, column) = match text.rfind(" at Line: ") {
        Some(i) => {
            let pos = &text[i + " at Line: ".len()..];
            let mut parts = pos.split(", Column: ");
            let line = parts.next().and_then(|l| l.trim().parse().ok());
            let column = parts.next().and_then(|c| c.trim().parse().ok());
            match (line, column) {
                (Some(l), Some(c)) => (text[..i].to_string(), l, c),
                _ => (text.clone(), fallback.0, fallback.1),
            }
        }
        None => (text, fallback.0, fallback.1),
    };
    PolicyError {
        line,
        column,
        message,
    }
}

struct Cursor<'a> {
    p: Parser<'a>,
    pools: &'a [String],
    /// Line and column just past the text, for errors at its end.
    end: (u64, u64),
}

impl Cursor<'_> {
    fn peek(&self) -> Token {
        self.p.peek_token().token
    }

    fn here(&self) -> (u64, u64) {
        let t = self.p.peek_token();
        if t.token == Token::EOF {
            return self.end;
        }
        (t.span.start.line, t.span.start.column)
    }

    fn error(&self, message: String) -> PolicyError {
        let (line, column) = self.here();
        PolicyError {
            line,
            column,
            message,
        }
    }

    /// The next token as an unquoted word, upper-cased, without taking it.
    fn peek_word(&self) -> Option<String> {
        match self.peek() {
            Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
            _ => None,
        }
    }

    fn eat_word(&mut self, word: &str) -> bool {
        if self.peek_word().as_deref() == Some(word) {
            self.p.next_token();
            return true;
        }
        false
    }

    fn expect_word(&mut self, word: &str, after: &str) -> Result<(), PolicyError> {
        if self.eat_word(word) {
            return Ok(());
        }
        Err(self.error(format!(
            "expected {word} after {after}, found {}",
            self.peek()
        )))
    }

    fn eat_token(&mut self, t: &Token) -> bool {
        if self.peek() == *t {
            self.p.next_token();
            return true;
        }
        false
    }

    fn expect_token(&mut self, t: &Token, what: &str) -> Result<(), PolicyError> {
        if self.eat_token(t) {
            return Ok(());
        }
        Err(self.error(format!("expected {t} {what}, found {}", self.peek())))
    }

    fn string(&mut self, what: &str) -> Result<String, PolicyError> {
        match self.peek() {
            Token::SingleQuotedString(s) => {
                self.p.next_token();
                Ok(s)
            }
            other => Err(self.error(format!("expected {what} in single quotes, found {other}"))),
        }
    }

    fn pool(&mut self, what: &str) -> Result<String, PolicyError> {
        let at = self.here();
        let pool = self.string(what)?;
        if !self.pools.contains(&pool) {
            return Err(PolicyError {
                line: at.0,
                column: at.1,
                message: format!(
                    "storage pool '{pool}' does not exist in this file system (pools: {})",
                    self.pools.join(", ")
                ),
            });
        }
        Ok(pool)
    }

    fn number(&mut self, what: &str) -> Result<u64, PolicyError> {
        match self.peek() {
            Token::Number(n, _) => match n.parse::<u64>() {
                Ok(v) => {
                    self.p.next_token();
                    Ok(v)
                }
                Err(_) => Err(self.error(format!("{what}: {n} is not a whole number"))),
            },
            other => Err(self.error(format!("expected {what}, found {other}"))),
        }
    }

    fn percent(&mut self, what: &str) -> Result<u8, PolicyError> {
        let at = self.here();
        let n = self.number(what)?;
        u8::try_from(n)
            .ok()
            .filter(|p| *p <= 100)
            .ok_or(PolicyError {
                line: at.0,
                column: at.1,
                message: format!("{what}: {n} is not a percentage (0-100)"),
            })
    }

    /// `(expr)` of a WEIGHT clause.
    fn paren_expr(&mut self, what: &str, scope: Scope) -> Result<Expr, PolicyError> {
        self.expect_token(&Token::LParen, &format!("after {what}"))?;
        let e = self.expr(scope)?;
        self.expect_token(&Token::RParen, &format!("to close {what}"))?;
        Ok(e)
    }

    fn expr(&mut self, scope: Scope) -> Result<Expr, PolicyError> {
        let e = self.p.parse_expr().map_err(|e| {
            // sqlparser gives no position for some errors; the token it stopped at is where.
            from_parser(e, self.here())
        })?;
        expr::check(&e, scope)?;
        Ok(e)
    }

    fn rule(&mut self) -> Result<Rule, PolicyError> {
        let (line, _) = self.here();
        if self.peek_word().as_deref() == Some("DEFINE") {
            return Err(
                self.error("define() macros are not supported; write the rules out in full".into())
            );
        }
        if !self.eat_word("RULE") {
            return Err(self.error(format!("expected RULE, found {}", self.peek())));
        }
        let name = match self.peek() {
            Token::SingleQuotedString(_) => Some(self.string("the rule name")?),
            _ => None,
        };
        let verb = self.peek_word().unwrap_or_default();
        match verb.as_str() {
            "SET" => {
                self.p.next_token();
                if self.peek_word().as_deref() != Some("POOL") {
                    return Err(self.error(format!(
                        "SET {}: only SET POOL (file placement) is implemented",
                        self.peek()
                    )));
                }
                self.p.next_token();
                let pool = self.pool("a pool name")?;
                let mut rule = Rule {
                    name,
                    line,
                    action: Action::SetPool { pool, limit: None },
                    filesets: None,
                    condition: None,
                };
                self.clauses(&mut rule, Scope::Placement)?;
                Ok(rule)
            }
            "MIGRATE" | "DELETE" | "LIST" => {
                self.p.next_token();
                let action = match verb.as_str() {
                    "MIGRATE" => Action::Migrate {
                        from: None,
                        weight: None,
                        to: String::new(),
                        limit: None,
                    },
                    "DELETE" => Action::Delete {
                        from: None,
                        weight: None,
                    },
                    _ => Action::List {
                        list: self.string("the list name")?,
                        from: None,
                        weight: None,
                    },
                };
                let mut rule = Rule {
                    name,
                    line,
                    action,
                    filesets: None,
                    condition: None,
                };
                self.clauses(&mut rule, Scope::Management)?;
                if let Action::Migrate { to, .. } = &rule.action {
                    if to.is_empty() {
                        return Err(PolicyError {
                            line,
                            column: 1,
                            message: format!("{} migrates without TO POOL 'pool'", rule.label()),
                        });
                    }
                }
                Ok(rule)
            }
            "EXTERNAL" => {
                self.p.next_token();
                if !self.eat_word("LIST") {
                    return Err(self.error(format!(
                        "EXTERNAL {}: only EXTERNAL LIST is implemented (external pools are not)",
                        self.peek()
                    )));
                }
                let list = self.string("the list name")?;
                self.expect_word("EXEC", "EXTERNAL LIST 'name'")?;
                let at = self.here();
                let exec = self.string("the program")?;
                if !exec.is_empty() {
                    return Err(PolicyError {
                        line: at.0,
                        column: at.1,
                        message: format!(
                            "EXEC '{exec}': running a program for a list is not implemented; \
                             write EXEC '' and `policy apply` prints the list"
                        ),
                    });
                }
                Ok(Rule {
                    name,
                    line,
                    action: Action::ExternalList { list },
                    filesets: None,
                    condition: None,
                })
            }
            "" => Err(self.error(format!(
                "expected SET POOL, MIGRATE, DELETE, LIST or EXTERNAL LIST, found {}",
                self.peek()
            ))),
            other => Err(self.error(format!(
                "{other} rules are not implemented; rules may SET POOL, MIGRATE, DELETE, LIST \
                 or declare an EXTERNAL LIST"
            ))),
        }
    }

    /// The optional clauses of a rule, in any order, each at most once, up to `;`, the end
    /// or the next RULE.
    fn clauses(&mut self, rule: &mut Rule, scope: Scope) -> Result<(), PolicyError> {
        let mut seen: Vec<String> = Vec::new();
        loop {
            match self.peek() {
                Token::SemiColon | Token::EOF => return Ok(()),
                _ => {}
            }
            let Some(word) = self.peek_word() else {
                return Err(self.error(format!("unexpected {} in {}", self.peek(), rule.label())));
            };
            if word == "RULE" {
                return Ok(());
            }
            if seen.contains(&word) {
                return Err(self.error(format!("{word} appears twice in {}", rule.label())));
            }
            let allowed: &[&str] = match &rule.action {
                Action::SetPool { .. } => &["LIMIT", "REPLICATE", "FOR", "WHERE"],
                Action::Migrate { .. } => {
                    &["FROM", "WEIGHT", "TO", "LIMIT", "REPLICATE", "FOR", "WHERE"]
                }
                Action::Delete { .. } | Action::List { .. } => &["FROM", "WEIGHT", "FOR", "WHERE"],
                Action::ExternalList { .. } => &[],
            };
            if !allowed.contains(&word.as_str()) {
                return Err(self.error(format!(
                    "unexpected {word} in {}; it may have {}",
                    rule.label(),
                    allowed.join(", ")
                )));
            }
            self.p.next_token();
            match word.as_str() {
                "LIMIT" => {
                    self.expect_token(&Token::LParen, "after LIMIT")?;
                    let l = self.percent("LIMIT")?;
                    self.expect_token(&Token::RParen, "to close LIMIT")?;
                    match &mut rule.action {
                        Action::SetPool { limit, .. } | Action::Migrate { limit, .. } => {
                            *limit = Some(l);
                        }
                        _ => unreachable!("LIMIT is allowed on SET POOL and MIGRATE only"),
                    }
                }
                "REPLICATE" => {
                    self.expect_token(&Token::LParen, "after REPLICATE")?;
                    let at = self.here();
                    let n = self.number("the number of copies")?;
                    self.expect_token(&Token::RParen, "to close REPLICATE")?;
                    if n != 1 {
                        return Err(PolicyError {
                            line: at.0,
                            column: at.1,
                            message: format!(
                                "REPLICATE({n}): data replication is not implemented yet; \
                                 every file has one copy"
                            ),
                        });
                    }
                }
                "FOR" => {
                    self.expect_word("FILESET", "FOR")?;
                    self.expect_token(&Token::LParen, "after FOR FILESET")?;
                    let mut sets = vec![self.string("a fileset name")?];
                    while self.eat_token(&Token::Comma) {
                        sets.push(self.string("a fileset name")?);
                    }
                    self.expect_token(&Token::RParen, "to close FOR FILESET")?;
                    rule.filesets = Some(sets);
                }
                "WHERE" => rule.condition = Some(self.expr(scope)?),
                "WEIGHT" => {
                    let w = self.paren_expr("WEIGHT", scope)?;
                    match &mut rule.action {
                        Action::Migrate { weight, .. }
                        | Action::Delete { weight, .. }
                        | Action::List { weight, .. } => *weight = Some(w),
                        _ => unreachable!("WEIGHT is allowed on MIGRATE, DELETE and LIST only"),
                    }
                }
                "FROM" => {
                    self.expect_word("POOL", "FROM")?;
                    let pool = self.pool("a pool name")?;
                    let threshold = if self.eat_word("THRESHOLD") {
                        self.expect_token(&Token::LParen, "after THRESHOLD")?;
                        let at = self.here();
                        let high = self.percent("the high occupancy")?;
                        self.expect_token(&Token::Comma, "between the high and low occupancy")?;
                        let low = self.percent("the low occupancy")?;
                        self.expect_token(&Token::RParen, "to close THRESHOLD")?;
                        if low > high {
                            return Err(PolicyError {
                                line: at.0,
                                column: at.1,
                                message: format!(
                                    "THRESHOLD({high},{low}): the low occupancy is above the high"
                                ),
                            });
                        }
                        Some(Threshold { high, low })
                    } else {
                        None
                    };
                    let from = Some(FromPool { pool, threshold });
                    match &mut rule.action {
                        Action::Migrate { from: f, .. }
                        | Action::Delete { from: f, .. }
                        | Action::List { from: f, .. } => *f = from,
                        _ => unreachable!("FROM is allowed on MIGRATE, DELETE and LIST only"),
                    }
                }
                "TO" => {
                    self.expect_word("POOL", "TO")?;
                    let pool = self.pool("a pool name")?;
                    if let Action::Migrate { to, .. } = &mut rule.action {
                        *to = pool;
                    }
                }
                _ => unreachable!("checked against the allowed clauses"),
            }
            seen.push(word);
        }
    }
}
