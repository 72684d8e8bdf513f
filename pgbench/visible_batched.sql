-- One batched visibility call: 1,000 identities x 100 changed rows.
SELECT count(*) FROM vis_batch b, realtime.visible('vis_messages', b.roles, b.claims, b.records) v;
