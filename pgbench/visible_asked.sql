-- One batched visibility call asked only the pairs a room filter lets through: 1,000
-- identities, each about its room's 10 of the 100 changed rows.
SELECT count(*) FROM vis_batch b, realtime.visible('vis_messages', b.roles, b.claims, b.records, b.asked) v;
