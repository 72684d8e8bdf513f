-- realtime.visible_current(entity, roles, claims, records): a resume's check (issue 39, H3).
-- The records are whole rows as their changes recorded them, and one is seen only while the
-- row with its key is visible to the identity and still holds, in every column the role
-- may read, what the record holds. A version written while the row was hidden (a draft
-- published since) is not seen; the row's latest version is. Columns the role may not read
-- are not compared. Uses the roles and auth helpers of authorize.sql.
CREATE TABLE vc_posts (id int PRIMARY KEY, status text NOT NULL, body text, notes text, at timestamptz, tags jsonb);
ALTER TABLE vc_posts ENABLE ROW LEVEL SECURITY;
CREATE POLICY published ON vc_posts FOR SELECT TO anon, authenticated USING (status = 'published');
GRANT SELECT (id, status, body, at, tags) ON vc_posts TO anon;
GRANT SELECT ON vc_posts TO authenticated;
INSERT INTO vc_posts VALUES (1, 'published', 'Press release', 'kept', '2026-11-28 10:00:00+00', '{"a": [1, 2.50]}'),
                            (2, 'draft', 'secret', NULL, NULL, NULL);

-- As recorded: the draft's INSERT, the UPDATE that published it, the current row written
-- with its time in another zone (the writer's session zone may differ), a row still
-- hidden, a row gone.
SELECT v.identity, v.record, v.error
FROM realtime.visible_current('vc_posts', ARRAY['anon', 'authenticated'], ARRAY['{}', '{}'],
    ARRAY['{"id": 1, "status": "draft", "body": "acquisition of X at $40M", "notes": "kept", "at": null, "tags": null}',
          '{"id": 1, "status": "published", "body": "Press release", "notes": "kept", "at": "2026-11-28T10:00:00+00:00", "tags": {"a": [1, 2.50]}}',
          '{"id": 1, "status": "published", "body": "Press release", "notes": "kept", "at": "2026-11-28T11:00:00+01:00", "tags": {"a": [1, 2.50]}}',
          '{"id": 2, "status": "draft", "body": "secret", "notes": null, "at": null, "tags": null}',
          '{"id": 3, "status": "published", "body": "gone", "notes": null, "at": null, "tags": null}']) v
ORDER BY 1, 2;
-- A column anon may not read (notes) is not compared for anon; authenticated reads it.
SELECT v.identity, v.record
FROM realtime.visible_current('vc_posts', ARRAY['anon', 'authenticated'], ARRAY['{}', '{}'],
    ARRAY['{"id": 1, "status": "published", "body": "Press release", "notes": "changed", "at": "2026-11-28T10:00:00+00:00", "tags": {"a": [1, 2.50]}}']) v
ORDER BY 1, 2;
-- realtime.visible asks only whether the key's row is visible: the draft's version passes.
SELECT v.identity, v.record
FROM realtime.visible('vc_posts', ARRAY['anon'], ARRAY['{}'],
    ARRAY['{"id": 1, "status": "draft", "body": "acquisition of X at $40M"}']) v;
SELECT has_function_privilege('public', 'realtime.visible_current(regclass,text[],text[],text[],integer[])', 'EXECUTE') AS public_can_call;
DROP TABLE vc_posts;
