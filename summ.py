import json,sys
for f in sys.argv[1:]:
    r=json.load(open(f))
    print('==', f, 'recoveries', r['edge_recoveries'], 'proxy_cuts', r['proxy_cuts'])
    for e in r['events']: print('  ev', {k:v for k,v in e.items()})
    for k,v in r['flows'].items(): print(' ', k, {x:v[x] for x in ('published','acked','missing','missing_eg','dup_msgs','dup_extra','order_inversions','arrived_unacked','wrong_topic')})
    b=r['bridge_final']; print('  final', {k:b.get(k) for k in ('forwarded','resent','gaps','lag_messages','inflight','received','received_dropped','connects','reconnects','short_links','cursor','checkpoint_cursor','last_error')})
    for s in r['snaps_after_events']: print('  snap', s)
