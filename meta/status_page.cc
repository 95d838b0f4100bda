#include "meta/status_page.h"

namespace ember::meta {

const char* StatusPageHtml() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Ember cluster</title>
<style>
body{font:14px system-ui,sans-serif;margin:20px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px}
table{border-collapse:collapse;background:#fff}td,th{padding:4px 10px;border:1px solid #ddd;text-align:right}
th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}
.alive{color:#137333;font-weight:600}.dead{color:#c5221f;font-weight:600}
.bar{display:inline-block;height:10px;background:#4285f4;vertical-align:middle}
.barbg{display:inline-block;width:120px;height:10px;background:#e8eaed;margin-right:6px;text-align:left}
.heat{text-align:center;min-width:64px}#err{color:#c5221f}.muted{color:#777}
svg{background:#fff;border:1px solid #ddd}
</style></head><body>
<h1>Ember cluster</h1><div class="muted">meta <span id="meta"></span> &middot; updated <span id="updated">never</span> <span id="err"></span></div>
<h2>Nodes</h2><table id="nodes"><thead><tr><th>node</th><th>state</th><th>labels</th><th>GPUs</th><th>cache use</th><th>blocks</th><th>hit ratio</th><th>from cache</th><th>from peers</th><th>from origin</th><th>peer errors</th></tr></thead><tbody></tbody></table>
<h2>Residency (share of each dataset's blocks on each node)</h2><table id="heat"><thead></thead><tbody></tbody></table>
<h2>Last minutes (cluster)</h2>
<div><svg id="ratio" width="420" height="120"></svg> <svg id="traffic" width="420" height="120"></svg></div>
<div class="muted">left: hit ratio per interval; right: MiB/s from <span style="color:#4285f4">cache</span>, <span style="color:#fbbc04">peers</span>, <span style="color:#ea4335">origin</span></div>
<h2>Prefetches</h2><table id="prefetches"><thead><tr><th>id</th><th>dataset</th><th>state</th><th>progress</th><th>nodes</th></tr></thead><tbody></tbody></table>
<h2>Jobs</h2><table id="jobs"><thead><tr><th>job</th><th>state</th><th>dataset</th><th>workers (node)</th></tr></thead><tbody></tbody></table>
<script>
function bytes(n){const u=['B','KiB','MiB','GiB','TiB'];let i=0;while(n>=1024&&i<u.length-1){n/=1024;i++}return (i?n.toFixed(1):n)+' '+u[i]}
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]))}
function cell(field,value,text){return '<td data-field="'+field+'" data-value="'+value+'">'+text+'</td>'}
function line(svg,series,max,colors){const w=svg.width.baseVal.value,h=svg.height.baseVal.value;let out='';
 series.forEach((pts,k)=>{if(pts.length<2)return;const step=w/(pts.length-1);
  out+='<polyline fill="none" stroke-width="2" stroke="'+colors[k]+'" points="'+pts.map((v,i)=>(i*step).toFixed(1)+','+(h-4-(max>0?v/max:0)*(h-8)).toFixed(1)).join(' ')+'"/>'});
 svg.innerHTML=out||'<text x="10" y="20" fill="#777">collecting samples...</text>'}
function render(s){
 document.getElementById('meta').textContent=s.meta;
 document.getElementById('updated').textContent=new Date().toLocaleTimeString();
 document.getElementById('nodes').tBodies[0].innerHTML=s.nodes.map(n=>{
  const look=n.hits+n.misses,ratio=look?n.hits/look:0,use=n.capacity_bytes?n.used_bytes/n.capacity_bytes:0;
  return '<tr data-node="'+esc(n.id)+'"><td>'+esc(n.id)+'<div class="muted">'+esc(n.address)+'</div></td>'+
   '<td class="'+n.state+'" data-field="state" data-value="'+n.state+'">'+n.state+'</td>'+
   '<td>'+esc(Object.entries(n.labels).map(([k,v])=>k+'='+v).join(' '))+'</td>'+cell('gpus',n.gpus,n.gpus)+
   '<td data-field="used_bytes" data-value="'+n.used_bytes+'"><span class="barbg"><span class="bar" style="width:'+(use*120).toFixed(0)+'px"></span></span>'+bytes(n.used_bytes)+' / '+bytes(n.capacity_bytes)+'</td>'+
   cell('resident_blocks',n.resident_blocks,n.resident_blocks)+cell('hit_ratio',ratio.toFixed(4),(ratio*100).toFixed(1)+'%')+
   cell('bytes_from_cache',n.bytes_from_cache,bytes(n.bytes_from_cache))+cell('bytes_from_peers',n.bytes_from_peers,bytes(n.bytes_from_peers))+
   cell('bytes_from_origin',n.bytes_from_origin,bytes(n.bytes_from_origin))+cell('peer_errors',n.peer_errors,n.peer_errors)+'</tr>'}).join('');
 const ids=s.nodes.map(n=>n.id),heat=document.getElementById('heat');
 heat.tHead.innerHTML='<tr><th>dataset</th>'+ids.map(i=>'<th>'+esc(i)+'</th>').join('')+'<th>anywhere</th></tr>';
 heat.tBodies[0].innerHTML=s.datasets.map(d=>'<tr><td>'+esc(d.name)+' <span class="muted">v'+d.version+', '+bytes(d.bytes)+'</span></td>'+
  ids.map(i=>{const f=d.fractions[i]||0;return '<td class="heat" data-dataset="'+esc(d.name)+'" data-node="'+esc(i)+'" data-value="'+f.toFixed(4)+
   '" style="background:rgba(66,133,244,'+(0.08+0.92*f).toFixed(2)+');color:'+(f>0.5?'#fff':'#222')+'">'+(f*100).toFixed(0)+'%</td>'}).join('')+
  '<td data-dataset="'+esc(d.name)+'" data-field="anywhere" data-value="'+d.anywhere.toFixed(4)+'">'+(d.anywhere*100).toFixed(0)+'%</td></tr>').join('');
 const h=s.history,ratio=[],cache=[],peer=[],origin=[];
 for(let i=1;i<h.length;i++){const dt=(h[i].t_ms-h[i-1].t_ms)/1000||1,dh=h[i].hits-h[i-1].hits,dm=h[i].misses-h[i-1].misses;
  ratio.push(dh+dm>0?dh/(dh+dm):0);cache.push((h[i].bytes_from_cache-h[i-1].bytes_from_cache)/dt/1048576);
  peer.push((h[i].bytes_from_peers-h[i-1].bytes_from_peers)/dt/1048576);origin.push((h[i].bytes_from_origin-h[i-1].bytes_from_origin)/dt/1048576)}
 line(document.getElementById('ratio'),[ratio],1,['#137333']);
 line(document.getElementById('traffic'),[cache,peer,origin],Math.max(1,...cache,...peer,...origin),['#4285f4','#fbbc04','#ea4335']);
 document.getElementById('prefetches').tBodies[0].innerHTML=s.prefetches.map(p=>{const f=p.blocks_total?p.blocks_done/p.blocks_total:0;
  return '<tr data-prefetch="'+esc(p.id)+'"><td>'+esc(p.id)+'</td><td>'+esc(p.dataset)+'</td><td>'+p.state+'</td><td data-field="progress" data-value="'+f.toFixed(4)+
  '"><span class="barbg"><span class="bar" style="width:'+(f*120).toFixed(0)+'px"></span></span>'+(f*100).toFixed(0)+'% of '+p.blocks_total+' blocks</td><td>'+esc(p.nodes.join(' '))+'</td></tr>'}).join('')||'<tr><td colspan="5" class="muted">none</td></tr>';
 document.getElementById('jobs').tBodies[0].innerHTML=s.jobs.map(j=>'<tr data-job="'+esc(j.name)+'"><td>'+esc(j.name)+'</td><td>'+j.state+'</td><td>'+esc(j.dataset)+'</td><td>'+
  esc(j.workers.join(' '))+'</td></tr>').join('')||'<tr><td colspan="4" class="muted">none</td></tr>';
 document.body.dataset.loaded='1'}
async function poll(){try{const r=await fetch('api/status');render(await r.json());document.getElementById('err').textContent=''}
 catch(e){document.getElementById('err').textContent='meta unreachable: '+e}setTimeout(poll,2000)}
poll();
</script></body></html>
)HTML";
}

}  // namespace ember::meta
