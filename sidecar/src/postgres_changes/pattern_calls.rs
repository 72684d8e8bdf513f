//! The order in which a table's pattern conditions (`like`, `ilike`, `match`, `imatch`) are
//! asked of the database, and how many one `realtime.match_patterns` call may take: the rules
//! that keep one client's patterns from spending another's check (issue 39, H1). No IO.
//!
//! - **Owners.** Every pattern belongs to the connections whose bindings hold it. Owners
//!   are asked in the order of how many distinct patterns they hold, fewest first (ties by
//!   connection id), and a pattern two owners share is asked with the first. So a client
//!   with one pattern is judged before one with sixty-four, and when the table's pattern
//!   budget (CHANGES_CHECK_TIMEOUT_MS) runs out, what is left undecided is the heaviest
//!   owners' patterns.
//! - **Calls.** The database stops each pattern at its own budget
//!   (FILTER_PATTERN_TIMEOUT_MS, `realtime.match_patterns`) and answers the others: a slow
//!   pattern fails alone. The call's statement_timeout, though, ends the whole call. So a
//!   call takes only as many patterns as can each spend their whole budget within
//!   `CALL_SHARE` of what is left of the table's (`fits`), and at most
//!   FILTER_PATTERNS_PER_CALL: however slow the patterns, the statement_timeout is never
//!   what stops a call, and a bystander's pattern that shares a call with slow ones is
//!   still judged.
//! - **Apart from RLS.** The RLS check that follows (`realtime.visible`) has a budget of its
//!   own (`deliver::authorize`): patterns never spend the time that decides everyone
//!   else's changes of the table.

use crate::out::ConnId;
use std::collections::HashSet;
use std::time::Duration;

/// The part of what is left of the table's budget that one call's patterns may spend at
/// most; the rest covers what is not a pattern's own time (the call, its arguments, the
/// answer).
const CALL_SHARE: f64 = 0.8;

/// The distinct patterns (1-based numbers) in the order they are asked: each owner's, fewest
/// first, each pattern once, at its first owner.
pub fn order(mut owners: Vec<(ConnId, Vec<i32>)>) -> Vec<i32> {
    for (_, patterns) in &mut owners {
        patterns.sort_unstable();
        patterns.dedup();
    }
    owners.sort_by_key(|(conn, patterns)| (patterns.len(), *conn));
    let mut placed = HashSet::new();
    let mut order = Vec::new();
    for (_, patterns) in owners {
        for p in patterns {
            if placed.insert(p) {
                order.push(p);
            }
        }
    }
    order
}

/// How many patterns one call may take with `left` of the table's budget: each may take
/// `each` before the database stops it, and all of them together stay within `CALL_SHARE` of
/// `left`; at most `per_call`. Zero: the budget is spent.
pub fn fits(left: Duration, each: Duration, per_call: usize) -> usize {
    let each = each.as_secs_f64().max(1e-6);
    let n = (left.as_secs_f64() * CALL_SHARE / each).floor() as usize;
    n.min(per_call)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_with_fewer_patterns_are_asked_first_and_a_shared_pattern_once() {
        let owners = vec![
            (7, vec![10, 11, 12, 13]),
            (3, vec![2]),
            (5, vec![2, 4]),
            (4, vec![9]),
        ];
        // 3 and 4 hold one each (3 first by id), then 5 (its 2 asked already), then 7.
        assert_eq!(order(owners), vec![2, 9, 4, 10, 11, 12, 13]);
    }

    #[test]
    fn a_call_takes_what_can_spend_its_budget_within_what_is_left() {
        let ms = Duration::from_millis;
        assert_eq!(fits(ms(2000), ms(100), 64), 16);
        assert_eq!(fits(ms(2000), ms(1), 64), 64);
        assert_eq!(fits(ms(120), ms(100), 64), 0);
        assert_eq!(fits(ms(125), ms(100), 64), 1);
        assert_eq!(fits(Duration::ZERO, ms(100), 64), 0);
    }
}
