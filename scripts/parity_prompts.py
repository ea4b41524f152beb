"""The wide parity prompt set (scripts/gen-parity-fixtures.py): languages and scripts, code,
numbers, whitespace, and two contexts past 500 tokens, on top of the six base prompts.

The int8 activation path's distance to exact math varies by prompt over more than an order of
magnitude in both vela and llama.cpp (docs/testing.md, "Accuracy of the quantized path"), so the
parity rule's geometric mean is only meaningful over many prompts of many kinds.
"""


P: dict[str, str] = {}
P["fr"] = "La Révolution française est une période de bouleversements politiques et sociaux en France et dans ses colonies, qui commence en 1789. Elle met fin à l'Ancien Régime en remplaçant la monarchie absolue par une monarchie constitutionnelle, puis par la Première République. Les causes de la Révolution sont"
P["de"] = "Die Relativitätstheorie befasst sich mit der Struktur von Raum und Zeit sowie mit dem Wesen der Gravitation. Sie besteht aus zwei maßgeblich von Albert Einstein geschaffenen physikalischen Theorien, der 1905 veröffentlichten speziellen Relativitätstheorie und der 1916 abgeschlossenen allgemeinen Relativitätstheorie. Die wichtigste Aussage"
P["es"] = "¿Qué es la fotosíntesis? Es el proceso mediante el cual las plantas, las algas y algunas bacterias convierten la energía luminosa en energía química. Durante este proceso, el dióxido de carbono y el agua se transforman en glucosa y oxígeno. La clorofila, un pigmento verde,"
P["ru"] = "Москва — столица России, город федерального значения, административный центр Центрального федерального округа и центр Московской области, в состав которой не входит. Крупнейший по численности населения город России и её субъект — 13 149 803 человека. Москва известна"
P["uk"] = "Київ — столиця та найбільше місто України. Розташований у середній течії Дніпра, у північній Наддніпрянщині. Політичний, соціально-економічний, транспортний, освітньо-науковий, історичний, культурний та духовний центр України. Місто"
P["zh"] = "长城是中国古代的军事防御工程，是一道高大、坚固而且连绵不断的长垣，用以限隔敌骑的行动。长城不是一道单纯孤立的城墙，而是以城墙为主体，同大量的城、障、亭、标相结合的防御体系。长城修筑的历史可上溯到"
P["ja"] = "東京都は日本の首都であり、関東地方に位置する。人口は約1400万人で、日本で最も人口の多い都道府県である。江戸時代には江戸と呼ばれ、徳川幕府の所在地として栄えた。明治維新の後、"
P["ko"] = "한국어는 대한민국과 조선민주주의인민공화국의 공용어이다. 한글은 1443년 조선의 세종대왕이 창제한 문자로, 과학적이고 배우기 쉬운 문자로 평가받는다. 한국어의 어순은"
P["ar"] = "اللغة العربية هي أكثر اللغات السامية تحدثاً، وإحدى أكثر اللغات انتشاراً في العالم، يتحدثها أكثر من 467 مليون نسمة. ويتوزع متحدثوها في الوطن العربي، بالإضافة إلى العديد من المناطق الأخرى المجاورة"
P["he"] = "ירושלים היא עיר הבירה של ישראל והעיר הגדולה ביותר בה. העיר שוכנת בהרי יהודה, בין הים התיכון לים המלח. ירושלים היא אחת הערים העתיקות בעולם, ו"
P["hi"] = "भारत दक्षिण एशिया में स्थित एक विशाल देश है। जनसंख्या के दृष्टिकोण से यह विश्व का सबसे बड़ा देश है। भारत की राजधानी नई दिल्ली है और इसकी सबसे बड़ी नगरी मुंबई है। भारत का इतिहास"
P["el"] = "Η Αθήνα είναι η πρωτεύουσα και μεγαλύτερη πόλη της Ελλάδας. Είναι μία από τις αρχαιότερες πόλεις του κόσμου, με καταγεγραμμένη ιστορία που ξεπερνά τα 3.400 χρόνια. Στην αρχαιότητα"
P["th"] = "ประเทศไทยเป็นประเทศที่ตั้งอยู่ในเอเชียตะวันออกเฉียงใต้ มีกรุงเทพมหานครเป็นเมืองหลวง ประชากรส่วนใหญ่นับถือศาสนาพุทธ ภาษาราชการคือ"
P["vi"] = "Việt Nam, tên chính thức là Cộng hòa Xã hội chủ nghĩa Việt Nam, là một quốc gia nằm ở cực Đông của bán đảo Đông Dương thuộc khu vực Đông Nam Á. Thủ đô của Việt Nam là"
P["tr"] = "Türkiye, topraklarının büyük bölümü Anadolu'da, küçük bir bölümü ise Balkanlar'ın uzantısı olan Trakya'da yer alan ülke. Başkenti Ankara, en kalabalık şehri ise İstanbul'dur. Türkiye'nin"
P["pl"] = "Polska, Rzeczpospolita Polska – państwo unitarne w Europie Środkowej, położone między Morzem Bałtyckim na północy a Sudetami i Karpatami na południu. Stolicą kraju jest"
P["mix"] = "English: The weather is nice today. Français : Il fait beau aujourd'hui. Deutsch: Das Wetter ist heute schön. Русский: Сегодня хорошая погода. 中文：今天天气很好。日本語：今日はいい天気です。한국어: 오늘 날씨가 좋네요. العربية: الطقس جميل اليوم. עברית: מזג האוויר נעים היום. हिन्दी: आज मौसम अच्छा है। Ελληνικά: Ο καιρός είναι ωραίος σήμερα. ไทย: วันนี้อากาศดี Tiếng Việt: Hôm nay trời đẹp. Türkçe: Bugün hava güzel. Polski: Dziś jest ładna pogoda. Español:"
P["mix2"] = "Translate: 'good morning' → bonjour (fr), guten Morgen (de), доброе утро (ru), 早上好 (zh), おはようございます (ja), 좋은 아침 (ko), صباح الخير (ar), בוקר טוב (he), सुप्रभात (hi), καλημέρα (el), สวัสดีตอนเช้า (th), chào buổi sáng (vi), günaydın (tr), dzień dobry (pl), buenos días (es), bom dia (pt), buongiorno (it), goedemorgen (nl), god morgen (da), hyvää huomenta (fi) and in Swahili:"
P["emoji"] = "Emoji test 😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘 ❤️🧡💛💚💙💜 🚀🌍🌕⭐ 👍🏽👋🏿 🇫🇷🇯🇵🇺🇸 — symbols: ∑∫√∞≈≠≤≥ ©®™ §¶†‡ ←↑→↓ ♠♣♥♦ and then"
P["py"] = "import numpy as np\n\n\ndef softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:\n    \"\"\"Numerically stable softmax.\"\"\"\n    m = np.max(x, axis=axis, keepdims=True)\n    e = np.exp(x - m)\n    return e / np.sum(e, axis=axis, keepdims=True)\n\n\nclass Attention:\n    def __init__(self, dim, heads):\n        self.dim = dim\n        self.heads = heads\n\n    def forward(self, q, k, v):\n"
P["rust"] = "use std::collections::HashMap;\n\n/// Counts word frequencies.\npub fn word_freq(text: &str) -> HashMap<String, usize> {\n    let mut m = HashMap::new();\n    for w in text.split_whitespace() {\n        *m.entry(w.to_lowercase()).or_insert(0) += 1;\n    }\n    m\n}\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n\n    #[test]\n    fn counts() {\n"
P["c"] = "#include <stdio.h>\n#include <stdlib.h>\n\nstruct node { int key; struct node *left, *right; };\n\nstatic struct node *insert(struct node *t, int key) {\n\tif (!t) {\n\t\tt = calloc(1, sizeof *t);\n\t\tt->key = key;\n\t\treturn t;\n\t}\n\tif (key < t->key)\n"
P["js"] = "const express = require('express');\nconst app = express();\napp.use(express.json());\n\napp.get('/api/users/:id', async (req, res) => {\n  const { id } = req.params;\n  try {\n    const user = await db.users.findOne({ where: { id } });\n    if (!user) return res.status(404).json({ error: 'not found' });\n"
P["sql"] = "SELECT c.customer_id, c.name, SUM(o.total) AS revenue, COUNT(DISTINCT o.order_id) AS orders\nFROM customers c\nJOIN orders o ON o.customer_id = c.customer_id\nWHERE o.created_at >= DATE '2024-01-01'\nGROUP BY c.customer_id, c.name\nHAVING SUM(o.total) > 1000\nORDER BY"
P["json"] = '{"id": 48213, "name": "Widget Pro", "price": 19.99, "tags": ["tools", "hardware"], "dimensions": {"w": 12.5, "h": 3.25, "d": 0.75}, "stock": [{"warehouse": "A1", "qty": 120}, {"warehouse": "B7", "qty": 0}], "active": true, "notes": null, "related": ['
P["html"] = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n  <meta charset=\"utf-8\">\n  <title>Dashboard</title>\n  <link rel=\"stylesheet\" href=\"/static/main.css\">\n</head>\n<body>\n  <nav class=\"navbar\">\n    <ul>\n      <li><a href=\"/\">Home</a></li>\n"
P["math"] = "Problem: If 3x + 7 = 22, what is x? Solution: 3x = 15, so x = 5.\nProblem: Compute 17 × 23. Solution: 17 × 23 = 391.\nProblem: What is 2^10 + 3^5? Solution: 1024 + 243 = 1267.\nProblem: Simplify (x^2 - 9)/(x - 3). Solution:"
P["nums"] = "Primes: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163, 167, 173, 179, 181, 191, 193, 197, 199, 211,"
P["digits"] = "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899862803482534211706798214808651328230664709384460955058223172535940812848111745028410270193852110555964462294895493038196 and e = 2.71828182845904523536028747135266249775724709369995957496696762772407663035354759457138217852516642742746639193200305992181741359662904357290033429526059563073813232862794349076323382988075319525101901157383418793070215408914993488416750924476146066808226480016847741185374234544243710753907774499206955170276183860626133138458300075204493382656029760673711320070932870912744374704723069697720931014169283681902551510865746377211125238978442505695369677078544996996794686445490598793163688923009879312773617821542499922957635148220826989519366803318252886939849646510582093923982948879332036250944311730123819706841614039701983767932068328237646480429531180606354477295"
P["table"] = "| Year | Revenue ($M) | Growth |\n|------|-------------:|-------:|\n| 2019 | 1,204.5 | 3.2% |\n| 2020 | 1,187.1 | -1.4% |\n| 2021 | 1,390.8 | 17.2% |\n| 2022 | 1,522.3 | 9.5% |\n| 2023 | 1,601.0 | 5.2% |\n| 2024 |"
P["ws"] = "Indented:\n    one\n        two\n            three\n\t\ttabbed\n\n\n\nafter blank lines   trailing spaces   \n  \u00a0non-breaking\u2003em-space\u3000ideographic space\nend   of    the     line      with       growing        gaps:"
P["ws2"] = "a  b   c    d     e      f       g        h         i          j           k            l             m              n               o                p\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n                                                                                q"
P["caps"] = "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG. WARNING: DO NOT OPERATE HEAVY MACHINERY. ALL CAPS TEXT IS OFTEN USED FOR EMPHASIS OR SHOUTING IN ONLINE COMMUNICATION, AND"
P["url"] = "See https://example.com/path/to/page?query=value&lang=en#section-3 or mailto:someone@example.org; hashes: sha256=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 uuid=123e4567-e89b-12d3-a456-426614174000 base64=SGVsbG8gV29ybGQhIFRoaXMgaXMgYSB0ZXN0Lg== and"
P["repeat"] = "the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the the"
P["poem"] = "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\nRough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\nSometime too hot the eye of heaven shines,\n"
P["long_mix"] = "\n\n".join(P[k] for k in ["fr","de","es","ru","uk","zh","ja","ko","ar","he","hi","el","th","vi","tr","pl"])
P["long_code"] = "\n\n".join(P[k] for k in ["py","rust","c","js","sql","json","html"]) * 2

KINDS = {
    **{k: "language" for k in ["fr", "de", "es", "ru", "uk", "zh", "ja", "ko", "ar", "he", "hi", "el",
                               "th", "vi", "tr", "pl", "mix", "mix2", "emoji"]},
    **{k: "code" for k in ["py", "rust", "c", "js", "sql", "json", "html"]},
    **{k: "numbers" for k in ["math", "nums", "digits", "table"]},
    **{k: "whitespace / casing / symbols" for k in ["ws", "ws2", "caps", "url", "repeat", "poem"]},
    "long_mix": "long multilingual (> 500 tokens)",
    "long_code": "long code (> 500 tokens)",
}
assert set(KINDS) == set(P)
