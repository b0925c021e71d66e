"""Select the public-domain part of Debian's fortunes-zh text into ``tests/data/zh_classical.txt``.

    python tests/data/select_zh.py ZH_FORTUNES_TXT [--output tests/data/zh_classical.txt]

The input is the fortunes-zh package's fortune files in the pretraining layout (one line per verse line, a blank
line between documents; how it was made is in tests/data/README.md). A document is kept when it is one of:

  tang       the "300 Tang poems" (``唐诗三百首``) file: its 2nd line starts ``作者：`` (author and title lines follow
             the poem's title); every author is of the Tang dynasty (618-907)
  dated      a poem whose 2nd line is ``作者:NAME（BIRTH－DEATH）`` with a death year (or birth year + 100 when the
             death is unknown) before 1900
  shijing    the Book of Songs (``詩經``, 11th-6th century BC): the first line starts ``《詩經``
  lunyu      the Analects (``论语``, 5th-3rd century BC): the last line is ``-- 论语...`` or ``--《论语》...``
  daodejing  the Tao Te Ching (``道德经``, 4th century BC): the last line is ``-- 《道德经...``
  author     a poem or ci whose last line is ``-- AUTHOR《title》`` with AUTHOR in ``AUTHORS`` below: each entry
             names when the author died (all before 1900); an author is listed only when the name is complete and
             identifies one classical poet (single-character truncations such as ``李《南乡子》`` are left out)

Everything else is dropped: modern authors (鲁迅, 钱钟书, 毛泽东, 吴军, 尤瓦尔·赫拉利 ...), Debian's texts, quotes of
programmers, proverbs and unattributed sayings (their wording may come from a modern collection), ``佚名``.
The kinds are interleaved evenly through the file (each keeps the input's order) so that any slice of lines mixes
them; the count of each kind is printed on stderr.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

# name -> when the author died (approximate where history is); every one before 1900
AUTHORS = {
    "辛弃疾": "1207", "苏轼": "1101", "李白": "762", "李煜": "978", "杜甫": "770", "陆游": "1210", "白居易": "846",
    "晏几道": "1110", "欧阳修": "1072", "晏殊": "1055", "柳永": "c. 1053", "王维": "761", "李商隐": "c. 858",
    "吴文英": "c. 1260", "纳兰性德": "1685", "韦庄": "910", "李清照": "c. 1155", "姜夔": "c. 1221", "温庭筠": "c. 866",
    "张炎": "c. 1320", "秦观": "1100", "张先": "1078", "杜牧": "852", "冯延巳": "960", "蒋捷": "c. 1305",
    "王昌龄": "c. 756", "岑参": "769", "刘禹锡": "842", "王安石": "1086", "刘过": "1206", "王沂孙": "c. 1291",
    "刘克庄": "1269", "张孝祥": "1170", "张籍": "c. 830", "杨万里": "1206", "史达祖": "c. 1220", "范成大": "1193",
    "张元": "c. 1170 (张元干, the name cut short in the source)", "陈亮": "1194", "范仲淹": "1052",
    "敦煌": "Dunhuang manuscripts, before the 11th century, anonymous", "刘长卿": "c. 789", "黄庭坚": "1105",
    "周密": "1298", "张九龄": "740", "陶渊明": "427", "韩愈": "824", "朱淑真": "c. 1135", "刘辰翁": "1297",
    "南宋无名氏": "Southern Song (1127-1279), anonymous", "元稹": "831", "李贺": "816", "韦应物": "c. 791",
    "文天祥": "1283", "戴叔伦": "789", "元好问": "1257", "高适": "765", "唐寅": "1524", "朱熹": "1200",
    "张若虚": "c. 730", "柳宗元": "819", "荀子": "c. 238 BC", "叶梦得": "1148", "王之涣": "742", "吕本中": "1145",
    "孟浩然": "740", "岳飞": "1142", "戴复古": "c. 1248", "袁去华": "Southern Song", "孙光宪": "968",
    "陈人杰": "1243", "许浑": "c. 858", "黄景仁": "1783", "王勃": "676", "王翰": "c. 726", "袁枚": "1798",
    "曹植": "232", "张泌": "10th century", "贺知章": "744", "屈原": "c. 278 BC", "周邦彦": "1121", "郑谷": "c. 909",
    "陈与义": "1138", "卢祖皋": "1224", "牛希济": "10th century", "韩元吉": "1187", "吴潜": "1262",
    "汪元量": "c. 1317", "李之仪": "1117", "徐再思": "Yuan (1271-1368)", "孟郊": "814", "马致远": "c. 1321",
    "林逋": "1028", "贾岛": "843", "郑燮": "1765", "杜荀鹤": "907", "宋祁": "1061", "顾太清": "1877", "谢逸": "1113",
    "李璟": "961", "苏舜钦": "1048", "李颀": "c. 757", "查慎行": "1727", "赵鼎": "1147", "李弥逊": "1153",
    "吕渭老": "Song", "葛长庚": "c. 1229", "王琪": "Song", "程垓": "Song", "杨炎正": "Song", "黄机": "Song",
    "石孝友": "Song", "崔护": "c. 831", "罗隐": "910", "杨慎": "1559", "贺铸": "1125", "龚自珍": "1841",
    "曹操": "220", "曹雪芹": "c. 1763", "林则徐": "1850", "张继": "c. 779", "王建": "c. 830", "李益": "829",
    "关汉卿": "c. 1300", "司马光": "1086", "朱敦儒": "1159", "王冕": "1359", "鱼玄机": "c. 868", "欧阳炯": "971",
    "武则天": "705", "夏完淳": "1647", "常建": "Tang", "寇准": "1023", "叶绍翁": "Song", "卢纶": "c. 799",
    "蒋士铨": "1785", "刘方平": "Tang", "鲍照": "466", "高鼎": "1880", "朱彝尊": "1709", "张可久": "Yuan",
    "张养浩": "1329", "郑板桥": "1765", "王观": "Song", "左思": "c. 306", "王禹偁": "1001", "胡令能": "Tang",
    "李重元": "Song", "潘阆": "1009", "王安国": "1074", "张舜民": "Song", "康与之": "Song", "张抡": "Song",
    "高观国": "Song", "严仁": "Song", "邓剡": "1303", "志南": "Song", "严蕊": "Song", "黄巢": "884",
    "张志和": "c. 774", "卢梅坡": "Song", "卢仝": "835", "张仲素": "c. 819", "刘彻": "87 BC", "崔涂": "Tang",
    "林升": "Song", "李冠": "Song", "陆龟蒙": "881", "颜真卿": "784", "丘处机": "1227", "周朴": "878",
    "李珣": "10th century", "聂胜琼": "Song", "刘将孙": "Yuan", "韩缜": "1097", "阎选": "10th century",
    "向子湮": "1152", "赵善括": "Song", "徐有贞": "1472", "张埜": "Yuan",
}

_FULLWIDTH = str.maketrans("０１２３４５６７８９", "0123456789")


def kind(doc: list[str]) -> str | None:
    """Which public-domain kind the document is (module docstring), or None to drop it."""
    second = doc[1] if len(doc) > 1 else ""
    last = doc[-1].strip()
    if second.startswith("作者："):
        return "tang"
    if second.startswith("作者:"):
        years = [int(y) for y in re.findall(r"\d+", second.translate(_FULLWIDTH))]
        died = years[1] if len(years) > 1 else (years[0] + 100 if years else None)
        name = re.sub(r"[（〔].*", "", second[3:]).strip()
        return "dated" if (died is not None and died < 1900) or name in AUTHORS else None
    if doc[0].startswith("《詩經"):
        return "shijing"
    if re.match(r"--\s*(论语|《论语》)", last):
        return "lunyu"
    if re.match(r"--\s*《道德经", last):
        return "daodejing"
    m = re.match(r"--\s*(\S+?)\s*《", last)
    if m and m.group(1) in AUTHORS:
        return "author"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", type=Path, help="fortunes-zh in the pretraining layout (blank-line separated documents)")
    p.add_argument("--output", type=Path, default=Path(__file__).with_name("zh_classical.txt"))
    args = p.parse_args(argv)
    docs = [d.strip("\n").split("\n") for d in args.input.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    by_kind: dict[str, list[str]] = {}
    counts = Counter()
    for doc in docs:
        k = kind(doc)
        counts[k or "dropped"] += 1
        if k:
            by_kind.setdefault(k, []).append("\n".join(line.rstrip() for line in doc))
    # Interleave the kinds evenly (document i of a kind of n sits at fraction (i + 0.5) / n of the file), so that
    # any run of lines, such as the tests' "first N lines for training, the next M held out", mixes every kind
    # instead of training on prose and evaluating on poems. Within a kind, the package's order is kept.
    order = sorted((((i + 0.5) / len(group), name, i) for name, group in by_kind.items() for i in range(len(group))))
    kept = [by_kind[name][i] for _, name, i in order]
    args.output.write_text("\n\n".join(kept) + "\n", encoding="utf-8")
    lines = sum(len(d.split("\n")) for d in kept)
    print(f"{args.output}: {len(kept)} of {len(docs)} documents, {lines} lines; {dict(counts)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
