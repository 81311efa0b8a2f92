"""Words and filler sentences the synthetic articles and books are made of: sentiment adjectives,
months and weekdays, and section filler per kind of entity."""

from __future__ import annotations

POSITIVE = (
    "beautiful",
    "charming",
    "pleasant",
    "delightful",
    "peaceful",
    "splendid",
    "lovely",
    "remarkable",
    "graceful",
    "wonderful",
    "handsome",
    "elegant",
)
NEGATIVE = (
    "dull",
    "dreary",
    "grim",
    "gloomy",
    "unpleasant",
    "bleak",
    "tedious",
    "miserable",
    "dreadful",
    "noisy",
    "dirty",
    "awful",
)
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
ORDINALS = ("first", "second", "third", "fourth", "fifth")

# Section filler. Keys in braces come from the article context (see _context); a {{ }} pair is a
# literal template, not a slot.
FILLER: dict[str, tuple[str, ...]] = {
    "history": (
        "Many {wa}s live near {s}, where they feed on {wd}.",
        "In {y1}, a great flood destroyed much of the lower town, and the people of {s} rebuilt the bridge "
        "over the {r}.",
        "During the {c} century, {s} was a small market town with a wooden church and a few narrow streets.",
        "The town walls were completed in {y1}, but most of them were pulled down in the following century.",
        "A fire in {y2} burned the old market, and the council ordered that new houses should be built of stone.",
        "Trade with {t2} brought wealth to the town, and many merchants built large houses near the harbour.",
        "In {y2} the town was granted a charter by the lords of {g}.",
        "The arrival of the railway in {y4} connected {s} with {t2} and the coast.",
        "Many families left the town during the hard winters of the {c} century, and some of them never returned.",
        "The old bridge, which had stood for more than two hundred years, was replaced in {y3}.",
        "A school was opened in {y4}, and by the end of the century most children in the town could read and write.",
        "For a long time there was little to distinguish {s} from the other villages along the {r}.",
        "The town was badly damaged in the war of {y2}, when soldiers from {g2} crossed the river.",
    ),
    "geography": (
        "The town is surrounded by low hills, open fields and small woods of oak and birch.",
        "The {r} is wide and slow here, and in spring it often floods the meadows to the south of the town.",
        "{s} lies {{{{convert|{km}|km|mi}}}} from {t2}, which can be reached by road or by boat along the {r}.",
        "The climate is {climate}, and snow is common on the higher ground between November and March.",
        "From the old tower there is a fine view of the valley and, on a clear day, of {m}.",
        "The older part of the town is built on a rise above the river, safe from the spring floods.",
    ),
    "economy": (
        "In recent years tourism has become more important, and several small hotels have opened near the river.",
        "The town market is held every {weekday}, and farmers from the surrounding villages bring fruit, "
        "cheese and wool.",
        "Goods are carried down the {r} to {t2} on flat barges, as they have been for centuries.",
        "Unemployment in {s} is lower than in most towns of {g}.",
        "The decline of the old workshops in the {c} century left many people without work.",
    ),
    "culture": (
        "Visitors often describe {s} as {pos}, although some find its narrow streets {neg}.",
        "The annual festival of {s} is held in {month}, when the streets are filled with music and lanterns.",
        "The old church of {s} is considered one of the most {pos} buildings in {g}.",
        "Writers who visited the town in the {c} century called it {neg} and poor, but later travellers "
        "found it {pos}.",
        "A small museum near the market tells the story of the town and of the {r}.",
    ),
    "life": (
        "{s} was the {ordinal} child of a {occ2} and grew up near the {r}.",
        "As a child, {pron} spent long summers on the banks of the {r}, drawing birds and boats.",
        "In {y1}, {s} moved to {t2}, where {pron} worked for several years.",
        "Critics praised the {pos} style of {poss} early work, but some later work was called {neg} and tedious.",
        "{Pron} married {p2} in {y2}; they had {n} children.",
        "{Pron} travelled widely in {g} and {g2}, and kept a careful diary of every journey.",
        "Late in life {s} returned to {t1}, where {pron} is buried in the old churchyard.",
        "Many of {poss} letters survive and are kept in the library of {t2}.",
        "Contemporaries described {s} as a {pos} and patient teacher.",
    ),
    "species": (
        "Like every {wa}, the {s} feeds on {wd}.",
        "As with other {wa}s, its diet is mostly {wd}.",
        "The {s} is most active at dawn and at dusk, and rests during the hottest part of the day.",
        "Females lay between {n} and {n2} eggs in late spring.",
        "The number of {s}s has fallen since the {c} century because of the draining of wetlands.",
        "Local fishermen consider the {s} a sign of good weather.",
        "The {s} is a shy animal and is rarely seen by visitors to {g}.",
        "Young {s}s are paler than the adults and only take on their full colour in their second year.",
        "It can grow to a length of {{{{convert|{n2}|cm|in}}}}.",
        "In winter the {s} moves to lower and warmer ground.",
    ),
    "river": (
        "The {ws} hunts along its banks for {wd}, as every {wa} does.",
        "The {s} is navigable for small boats as far as {t1}.",
        "Its waters are cold and clear in the upper valley, and slow and brown near its mouth.",
        "The river freezes in hard winters, and in {y1} people walked across it from {t1} to the far bank.",
        "Several old mills stand along the {s}, although none of them still works.",
        "The valley of the {s} is known for its {pos} scenery and its fields of barley.",
        "A long stone bridge crosses the {s} at {t1}; it was built in {y2}.",
    ),
    "ship": (
        "In {y1} the {s} ran aground near {t2}, but the whole crew was saved.",
        "She carried wool, salt and timber between {t1} and {t2} for many years.",
        "Sailors said that the {s} was {pos} in calm water but {neg} in a storm.",
        "The {s} was repaired and given new sails in {y2}.",
        "She was finally broken up in {y3}, and parts of her timbers were used to build a barn near {t1}.",
    ),
    "guild": (
        "The guild kept strict rules about the training of apprentices, who served for seven years.",
        "Its hall, built in {y1}, stands on the market square of {t1}.",
        "Members of the guild met on the first {weekday} of every month.",
        "In {y2} the guild paid for a new bridge over the {r}.",
        "The guild lost much of its power in the {c} century, when new factories were opened in {t2}.",
    ),
    "mountain": (
        "The lower slopes of {s} are covered with forests of pine and beech.",
        "The first recorded ascent of {s} was made in {y1} by a party from {t1}.",
        "On a clear day the summit offers a view over the whole of {g}.",
        "Shepherds still bring their flocks to the high meadows of {s} every summer.",
        "The mountain is often covered with cloud, and the weather on the summit can be {neg}.",
    ),
    "region": (
        "{s} is a land of wide river valleys, small farms and old market towns.",
        "Travellers from {g2} often found the people of {s} {pos} and generous, though the inns were {neg}.",
        "After the great famine of {y2}, many families from {s} moved to the coast.",
        "The old road from {t1} to {t2} follows the {r} for most of its length.",
        "The region has its own laws and a council that meets every spring in its capital.",
        "The people of {s} speak a dialect that is hard for visitors from {g2} to understand.",
        "In {y1} the towns of {s} formed a league to protect their trade on the {r}.",
        "Most of {s} is farmland, but the hills in the north are covered with forest.",
        "The roads of {s} were poor until the {c} century, and most goods travelled by river.",
    ),
}
