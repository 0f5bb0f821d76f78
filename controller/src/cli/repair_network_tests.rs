use serde_json::json;

use super::*;

#[test]
fn every_interface_is_a_row_and_one_that_did_not_come_back_says_so() {
    let repair = json!({"interfaces": [
        {"name": "eth0", "mac": "00:16:3e:00:00:01", "mtu": 1500,
         "addresses": ["10.0.0.5", "fe80::216:3eff:fe00:1"]},
        {"name": "eth1", "mac": "", "mtu": 0, "addresses": []},
    ]});
    let table = interfaces_table(&repair);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        [
            vec!["INTERFACE", "MAC", "MTU", "ADDRESSES"],
            vec![
                "eth0",
                "00:16:3e:00:00:01",
                "1500",
                "10.0.0.5",
                "fe80::216:3eff:fe00:1"
            ],
            vec!["eth1", "(gone)", "0", "none"],
        ]
    );
}
